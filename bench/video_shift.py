"""workload=video with the notes' worker shifting applied against the same run with it logged only.

    python -m bench video_shift      # ~14 min on 2 idle cores (3 repeats)

What is compared: the time the default video run takes to bring the streams' averaged validation
top-1 to `target` (``time/to_target_s``: training stops there), with ``video.shift_apply=true``
(the rule moves a Train worker to the lagging stream, relaunching both streams' runs at an epoch
mark; docs/video.md) against ``video.shift_apply=false`` (the same rule, logged only).
Why it is fair: the same command, seed, data, epochs and target; only the one key differs; each
run is a fresh ``python -m orchard`` process; the two alternate within each repeat. Quality: the
fused validation top-1 each run ended with, the epochs it trained and the shifts it applied.
The question the notes leave open is whether shifting pays for its relaunches; on a machine where
every worker shares the same few cores, a worker moved between streams adds no compute.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Where the runs' MLflow stores and output folders are kept when set (the test suite reads the
# shifted run's own records from there); a temporary folder, removed at the end, otherwise.
KEEP_RUNS_ENV = "ORCHARD_BENCH_RUNS_DIR"

SIZES = {
    # the default run (6 classes, 6 epochs, rgb + flow) stopped once the averaged streams reach top-1 0.6
    "full": {"overrides": ["video.target_top1=0.6"]},
    # checks the bench runs: no target (the whole training is timed), any loss gap shifts a worker
    "smoke": {"overrides": ["debug=smoke", "video.epochs=4", "video.queue_depth=2",
                            "video.workers={spatial: 2, temporal: 2}", "video.shift_ratio=1.0"]},
}
ESTIMATE = "~14 min on 2 idle cores (3 repeats)"


def one_run(overrides: list[str], shift: bool, tmp: Path, i: int) -> dict:
    """One fresh ``python -m orchard workload=video`` run; its final metrics."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp}/shift{int(shift)}_{i}.db"
    args = [sys.executable, "-m", "orchard", "workload=video", *overrides, f"video.shift_apply={str(shift).lower()}",
            f"tracking.uri={uri}", f"output_dir={tmp}/out{int(shift)}_{i}", "progress=never"]
    done = subprocess.run(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"video run (shift_apply={shift}) exited {done.returncode}: {done.stderr[-500:]}")
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("video").experiment_id])
    return run.data.metrics


def measure(size: dict, repeats: int) -> list[dict]:
    from bench.rows import row

    runs: dict[bool, list[dict]] = {True: [], False: []}
    keep = os.environ.get(KEEP_RUNS_ENV)
    with (contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory()) as name:
        for i in range(repeats):
            for shift in (True, False):  # alternate: a change of load hits both
                m = one_run(size["overrides"], shift, Path(name), i)
                runs[shift].append(m)
                print(f"  video_shift: shift_apply={shift}: to target {m.get('time/to_target_s')}, "
                      f"epochs {m.get('train/epochs_run')}, shifts {m.get('pipeline/shifts_applied')}", flush=True)

    def seconds(m: dict) -> float:  # a run that never met the target: its whole training time
        return m.get("time/to_target_s", m.get("time/train_s", float("nan")))

    def quality(ms: list[dict]) -> dict:
        last = ms[-1]
        fused = max((v for k, v in last.items() if k.startswith("val/agg_") and k.endswith("_top1")), default=0.0)
        return {"met target": f"{sum('time/to_target_s' in m for m in ms)}/{len(ms)}", "fused top-1": fused,
                "epochs": last.get("train/epochs_run"), "shifts applied": last.get("pipeline/shifts_applied"),
                "relaunch wait s": last.get("pipeline/shift_wait_s")}

    return [row("time to the target top-1 (training)", "s", [seconds(m) for m in runs[True]],
                [seconds(m) for m in runs[False]], higher_is_better=False,
                orchard_label="video.shift_apply=true (workers shifted)",
                peer_label="video.shift_apply=false (rule logged only)",
                quality={"orchard": quality(runs[True]), "peer": quality(runs[False])},
                note=" ".join(size["overrides"]))]
