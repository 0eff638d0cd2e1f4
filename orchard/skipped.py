"""Files a workload could not read: skipped and counted by kind, never silently dropped.

The bad-data policy (docs/runs.md, issue 31): a file that cannot be read or parsed is set aside
with its reason, the run counts it (``data/skipped_files`` and ``data/skipped/<kind>``), lists it
in the artifact ``skipped.csv`` (file, kind, reason) and says so on the terminal; the run fails
only when too little is left (``too_many_skipped``: one line naming the first bad file and the
count, exit 2).  Workloads decide what a kind is (``truncated``, ``not_image``, ...); this module
only keeps, counts, writes and reports them.
"""
from __future__ import annotations

import csv
import io
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, NamedTuple

SKIPPED_CSV = "skipped.csv"
SHOWN = 20  # files named on the terminal; the rest are in skipped.csv


class SkippedFile(NamedTuple):
    file: str    # the file's name (or path relative to the data folder)
    kind: str    # why, in one word: the key of data/skipped/<kind>
    reason: str  # why, in one line


def metrics(skipped: Iterable[SkippedFile]) -> dict[str, float]:
    """``data/skipped_files`` (always, 0 when none) and ``data/skipped/<kind>`` per kind."""
    skipped = list(skipped)
    counts = Counter(s.kind for s in skipped)
    return {"data/skipped_files": float(len(skipped)), **{f"data/skipped/{k}": float(n) for k, n in counts.items()}}


def to_csv(skipped: Iterable[SkippedFile]) -> str:
    """The text of ``skipped.csv``: a header ``file,kind,reason`` and one row per file."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SkippedFile._fields)
    writer.writerows(skipped)
    return out.getvalue()


def write_csv(skipped: Iterable[SkippedFile], path: str | Path) -> Path:
    Path(path).write_text(to_csv(skipped))
    return Path(path)


def read_csv(path: str | Path) -> list[SkippedFile]:
    """What ``write_csv`` wrote ([] when the file is absent)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return [SkippedFile(r["file"], r["kind"], r["reason"]) for r in csv.DictReader(fh)]


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as a reason: its first line, at most ``limit`` characters."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def report(ctx, skipped: list[SkippedFile], workload: str, step: int | None = None) -> dict[str, float]:
    """Name the skipped files on the terminal (the first ``SHOWN``), log ``skipped.csv`` (only
    when there are any) and the metrics; returns the metrics."""
    from orchard.console import say

    for s in skipped[:SHOWN]:
        say(f"{workload}: skipped {s.file} ({s.kind}): {s.reason}", file=sys.stderr)
    if len(skipped) > SHOWN:
        say(f"{workload}: ... and {len(skipped) - SHOWN} more skipped (the run's {SKIPPED_CSV})", file=sys.stderr)
    if skipped:
        ctx.log_text(to_csv(skipped), SKIPPED_CSV)
    counted = metrics(skipped)
    ctx.log_metrics(counted, step=step)
    return counted


def too_many_skipped(skipped: list[SkippedFile], total: int, max_fraction: float, limit_key: str,
                     what: str = "files") -> str:
    """``""`` when enough is left; else the one-line complaint naming the first bad file and the
    count: nothing readable, or more than ``max_fraction`` (the config key ``limit_key``) of the
    ``total`` files skipped."""
    if not skipped:
        return ""
    first = f"first: {skipped[0].file}: {skipped[0].kind}, {skipped[0].reason}"
    if len(skipped) >= total:
        return f"readable {what}; none of the {total} could be used ({first})"
    if len(skipped) > max_fraction * total:
        return (f"readable {what}; {len(skipped)} of {total} could not be used, more than "
                f"{limit_key}={max_fraction:g} allows ({first})")
    return ""
