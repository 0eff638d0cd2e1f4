"""A workload's default run, measured: `python -m orchard workload=<name>` as a newcomer types it.

    python -m bench.default_run_record forest        # ~3.5 min on 2 idle cores
    python -m bench.default_run_record video_footage # video on mixed-size H.264 footage, ~1.5 min

Runs the command with its own MLflow store and output folder (nothing else on the command line),
reads the run's headline figures back from MLflow and writes them, with the commit, the date and the
load average before and after, under the workload's key in docs/records/default_runs.json. The docs
quote them as markers (`<!-- fig default_runs.json - forest.test_pixel_accuracy -->`, see
bench/doc_figures.py), so a new default re-measured here updates the prose with `python -m bench
--render`, and a changed default that nobody re-measured cannot hide behind hand-typed figures.
Run it on an idle machine and from a committed tree: the record names the commit.

`video_footage` is video's command on footage of mixed sizes instead of its synthetic 64x64 clips
(`synthetic_videos.write_mixed_footage`: 176x144, 640x272 and 1280x720 H.264 files, four copies
of each as its class, two epochs): the case where decoding, not training, is what the trainers
wait for (issue 51).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import committed_head

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "records" / "default_runs.json"
# the figures worth quoting (not the per-class or per-node ones), each recorded with "/" as "_":
# MLflow's "time/total_s" is "time_total_s", so a marker's field reads like a name
KEPT_PREFIXES = ("time/", "test/", "throughput/", "train/", "headline/", "val/",
                 "pipeline/")   # video: its trainers' wait (the mean and the worst epoch), its stages


# records that are a workload's command on other data: key -> (workload, its overrides, the data it needs)
VARIANTS = {"video_footage": ("video", ["video.epochs=2"], "footage")}


def run_figures(workload: str) -> dict:
    """Run the default command in a scratch folder; its headline metrics, flattened."""
    import mlflow

    with tempfile.TemporaryDirectory(prefix=f"orchard-default-{workload}-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        name, extra, data = VARIANTS.get(workload, (workload, [], None))
        shown = extra   # the command as the record shows it: a scratch folder by what made it
        if data == "footage":
            from workloads.video.synthetic_videos import write_mixed_footage

            extra = [f"video.root={write_mixed_footage(Path(tmp) / 'footage')}", *extra]
            shown = ["video.root=<synthetic_videos.write_mixed_footage>", *shown]
        cmd = [sys.executable, "-m", "orchard", f"workload={name}", *extra, f"tracking.uri={uri}", f"output_dir={tmp}/out"]
        load_before = os.getloadavg()[0]
        t0 = time.monotonic()
        with open(Path(tmp) / "log", "w+") as log:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
            process_s = time.monotonic() - t0
            if rc:
                log.seek(0)
                raise SystemExit(f"default_run_record: `{' '.join(cmd[1:])}` exited {rc}:\n{log.read()[-2000:]}")
        client = mlflow.MlflowClient(uri)
        run = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 order_by=["attributes.start_time DESC"], max_results=1)[0]
        metrics = {k.replace("/", "_"): v for k, v in run.data.metrics.items()
                   if k.startswith(KEPT_PREFIXES) and "/class_acc/" not in f"/{k}"}
        return {"command": " ".join(["python -m orchard", f"workload={name}", *shown]), "status": run.info.status,
                "process_s": process_s, "load_before": load_before, "load_after": os.getloadavg()[0], **metrics}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.default_run_record", description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=["forest", "flower", "video", "singa", *VARIANTS])
    args = ap.parse_args(argv)
    commit = committed_head("default_run_record")
    figures = run_figures(args.workload)
    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    record[args.workload] = figures
    record.setdefault("commits", {})[args.workload] = commit
    record.setdefault("measured_utc", {})[args.workload] = when
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"default_run_record: wrote {RECORD}: {args.workload} {figures['status']} in "
          f"{figures.get('time_total_s', float('nan')):.1f} s (process {figures['process_s']:.1f} s), "
          f"load {figures['load_before']:.2f} -> {figures['load_after']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
