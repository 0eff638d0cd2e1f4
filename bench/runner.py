"""Runs one bench in a child process while this one samples the machine, then writes its JSON.

The child (`python -m bench.runner --child ...`) imports the bench module and calls
`measure(size, repeats)`; orchard and the peers it starts (Ray, spawned processes) are all its
descendants, so the sampler here can tell their CPU from everybody else's.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import BENCHES, EXTRA_BENCHES, journal
from bench.machine import LoadSampler, describe, load_summary, loadavg
from bench.rows import summarize

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "results"
SCHEMA = 1


def settle(max_wait_s: float, cores: int) -> float:
    """Wait (up to `max_wait_s`) for the 1-minute load to fall to half the cores: the previous
    bench's own load must not make the next one look loaded. Returns the seconds waited."""
    t0 = time.monotonic()
    while loadavg() > cores / 2 and time.monotonic() - t0 < max_wait_s:
        time.sleep(5)
    return time.monotonic() - t0


def run_bench(name: str, smoke: bool, repeats: int, out_dir: Path, command: str, settle_s: float) -> dict:
    """Measure bench `name` in a child process; write and return its result."""
    module, full_size = {**BENCHES, **EXTRA_BENCHES}[name]
    size = "smoke" if smoke else full_size
    cores = os.cpu_count() or 1
    waited = settle(settle_s, cores) if settle_s else 0.0
    sampler = LoadSampler(interval_s=1.0 if smoke else 2.0, window_s=10.0 if smoke else 30.0)
    started = dt.datetime.now(dt.timezone.utc)
    sampler.start()
    rerun = f"python -m bench {name}" + (" --smoke" if smoke else "")
    kept = journal.path_for(out_dir, name)
    journal.start(kept, {"bench": name, "module": module, "size_name": size, "smoke": smoke, "repeats": repeats,
                         "command": command, "rerun": rerun, "started_utc": started.isoformat(timespec="seconds"),
                         "machine": describe(), "load_before": sampler.before})
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        rows_file = Path(tmp) / "rows.json"
        # the checkout on PYTHONPATH: Ray workers and spawned peers import workloads/ and bench/ from it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               journal.ENV: str(kept)}
        proc = subprocess.run([sys.executable, "-m", "bench.runner", "--child", module, size, str(repeats),
                               str(rows_file)], check=False, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        load = sampler.stop()
        child = json.loads(rows_file.read_text()) if rows_file.exists() else None
    if proc.returncode != 0 or child is None:
        # the child's stderr was captured to say why in one line; print it whole for the reader
        sys.stderr.write(proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        error = lines[-1][:300] if lines else f"exit {proc.returncode}"
    else:
        error = None
    result = {
        "schema": SCHEMA, "bench": name, "module": module, "size_name": size, "smoke": smoke,
        "repeats": repeats, "command": command, "rerun": rerun,
        "started_utc": started.isoformat(timespec="seconds"), "wall_s": load["wall_s"], "settle_wait_s": waited,
        "machine": describe(), "load": load, "error": error,
        "size": (child or {}).get("size"), "estimate": (child or {}).get("estimate"),
        "doc": (child or {}).get("doc", ""),
        "rows": [summarize(r) for r in (child or {}).get("rows", [])],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    runs = len(journal.read(kept)[1])
    if error is None or not runs:
        kept.unlink()
    else:  # what the child finished before it failed stays, to be written as a file of its own
        print(f"bench: {name}: its {runs} finished runs are kept in {kept}; "
              f"`python -m bench --from-runs {kept}` writes a results file of them", file=sys.stderr)
    return result


def rebuild(kept: Path, out_dir: Path) -> dict:
    """The results file of a bench stopped part-way, from the runs its journal kept
    (bench/journal.py): the rows those runs make, marked partial, with the load they saw."""
    header, runs = journal.read(kept)
    try:
        module = importlib.import_module(header["module"])
        if not hasattr(module, "rows_from_runs"):
            raise ValueError(f"{kept}: bench {header['bench']} keeps no runs to write a results file from")
        size = module.SIZES[header["size_name"]]
        rows = module.rows_from_runs(size, header["machine"]["cores"], runs)
    except KeyError as exc:  # a journal of another version of the bench
        raise ValueError(f"{kept}: this bench's code does not know its {exc} (written by another version?)") from None
    finished = [r for r in runs if "run" in r]
    last = dt.datetime.fromisoformat(runs[-1]["utc"]) if runs else dt.datetime.fromisoformat(header["started_utc"])
    result = {
        "schema": SCHEMA, **{k: header[k] for k in ("bench", "module", "size_name", "smoke", "repeats", "command",
                                                     "rerun", "started_utc", "machine")},
        "wall_s": (last - dt.datetime.fromisoformat(header["started_utc"])).total_seconds(), "settle_wait_s": 0.0,
        "load": journal_load(header, runs), "error": None,
        "partial": f"written from the {len(finished)} run{'' if len(finished) == 1 else 's'} it finished "
                   f"before it was stopped (`python -m bench --from-runs {kept.name}`)",
        "size": size, "estimate": getattr(module, "ESTIMATE", None), "doc": module.__doc__ or "",
        "rows": [summarize(r) for r in rows],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{header['bench']}.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    return result


def journal_load(header: dict, runs: list[dict]) -> dict:
    """The load of a journal's runs in the sampler's form (bench/machine.py, `load_summary`): the
    load before the bench, the load average as each run ended, and per run the cores other
    processes took (the machine's busy seconds less the bench's own, over the run's wall)."""
    cores = header["machine"]["cores"] or 1
    foreign = [min(float(cores), max(0.0, (r["run"]["machine_cpu_s"] - r["run"]["bench_cpu_s"]) / r["run"]["wall_s"]))
               for r in runs if "machine_cpu_s" in r.get("run", {})]
    loads = [r["load1"] for r in runs]
    return load_summary(cores, header["load_before"], loads, foreign,
                        {"load1": loads[-1] if loads else header["load_before"]["load1"]},
                        wall_s=None, window_s=None, pauses=[])


def child_main(module_name: str, size_name: str, repeats: int, out: str) -> None:
    module = importlib.import_module(module_name)
    size = module.SIZES[size_name]
    rows = module.measure(size, repeats)
    Path(out).write_text(json.dumps({"size": size, "estimate": getattr(module, "ESTIMATE", None),
                                     "doc": module.__doc__ or "", "rows": rows}, default=float))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=4, metavar=("MODULE", "SIZE", "REPEATS", "OUT"), required=True)
    a = ap.parse_args()
    child_main(a.child[0], a.child[1], int(a.child[2]), a.child[3])
