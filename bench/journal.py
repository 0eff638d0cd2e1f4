"""A bench's runs, one JSON line each the moment it ends: what a bench stopped part-way keeps.

A bench writes its results file when its ``measure`` returns. On a lent machine a call ends at
its time limit (docs/scaling.md, "On a lent many-core machine"), and a bench stopped there wrote
nothing: every run it had finished was lost with it. So the runner gives the bench's child a
journal (``<results>/<bench>.runs.jsonl``, the environment's ``ORCHARD_BENCH_JOURNAL``): a first
line with what the results file says of the bench and its machine, then a line per finished run,
written and flushed before the next run starts. A bench that ends writes its results file and
removes the journal; one that was stopped leaves it, and

    python -m bench --from-runs docs/benchmarks/results/<bench>.runs.jsonl

writes the results file from the runs it holds, on any machine, marked partial (which runs are
missing, and the load the runs themselves saw). A bench module takes part by calling `add` for
each run and giving `rows_from_runs(size, cores, runs)`; bench/scaling.py (a line a run) and
bench/video_cores.py (a line a core count) do.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

ENV = "ORCHARD_BENCH_JOURNAL"
SUFFIX = ".runs.jsonl"


def path_for(out_dir: Path, name: str) -> Path:
    return out_dir / f"{name}{SUFFIX}"


def start(path: Path, header: dict) -> None:
    """A new journal at ``path`` whose first line is ``header`` (the bench, its size, its machine)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"header": header}, default=float) + "\n")


def add(key: dict, run: dict | None = None, failed: str | None = None) -> None:
    """Append one finished run (``key`` says which: workload, workers, nodes), or a failure, to the
    journal the runner named; nothing where none is named (a bench's tests, a direct call)."""
    where = os.environ.get(ENV)
    if not where:
        return
    from bench.machine import loadavg

    line = {"key": key, "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "load1": loadavg(), **({"run": run} if run is not None else {}),
            **({"failed": failed} if failed is not None else {})}
    # one write of a whole line, flushed to the disk: a kill between two runs leaves whole lines
    with open(where, "a") as f:
        f.write(json.dumps(line, default=float) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read(path: Path) -> tuple[dict, list[dict]]:
    """The header and the runs of a journal. A last line cut by a kill is left out; anything else
    unreadable raises ValueError naming the file and the line."""
    lines = path.read_text().splitlines()
    if not lines:
        raise ValueError(f"{path}: empty, not a bench journal")
    out = []
    for i, text in enumerate(lines, 1):
        try:
            out.append(json.loads(text))
        except json.JSONDecodeError:
            if i == len(lines):  # the line being written when the bench was killed
                break
            raise ValueError(f"{path}: line {i} is not JSON") from None
    if "header" not in out[0]:
        raise ValueError(f"{path}: its first line is not a bench journal's header")
    return out[0]["header"], out[1:]
