"""Files a workload could not read: skipped and counted by kind, never silently dropped.

The bad-data policy (docs/runs.md, issue 31): a file that cannot be read or parsed is set aside
with its reason, the run counts it (``data/skipped_files`` and ``data/skipped_files/<kind>``), lists it
in the artifact ``skipped.csv`` (file, kind, reason) and says so on the terminal; the run fails
only when too little is left (``too_many_skipped``: one line naming the first bad file and the
count, exit 2).  Workloads decide what a kind is (``truncated``, ``not_image``, ...); this module
only keeps, counts, writes and reports them.
"""
from __future__ import annotations

import csv
import io
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, NamedTuple

SKIPPED_CSV = "skipped.csv"
SHOWN = 20  # files named on the terminal; the rest are in skipped.csv


class SkippedFile(NamedTuple):
    file: str    # the file's name (or path relative to the data folder)
    kind: str    # why, in one word: the key of data/skipped_files/<kind>
    reason: str  # why, in one line


def metrics(skipped: Iterable[SkippedFile]) -> dict[str, float]:
    """``data/skipped_files`` (always, 0 when none) and ``data/skipped_files/<kind>`` per kind: the
    breakdown under its total's name, so a runs table or a key sorted by name shows the total first."""
    skipped = list(skipped)
    counts = Counter(s.kind for s in skipped)
    return {"data/skipped_files": float(len(skipped)), **{f"data/skipped_files/{k}": float(n) for k, n in counts.items()}}


def to_csv(skipped: Iterable[SkippedFile]) -> str:
    """The text of ``skipped.csv``: a header ``file,kind,reason`` and one row per file."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SkippedFile._fields)
    writer.writerows(skipped)
    return out.getvalue()


def write_csv(skipped: Iterable[SkippedFile], path: str | Path) -> Path:
    from orchard.storage import write_atomic

    write_atomic(path, to_csv(skipped).encode())   # a reader (resume, a tile cache) never sees half of it
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
    from orchard.terminal.console import say

    for s in skipped[:SHOWN]:
        say(f"{workload}: skipped {s.file} ({s.kind}): {s.reason}", file=sys.stderr)
    if len(skipped) > SHOWN:
        say(f"{workload}: ... and {len(skipped) - SHOWN} more skipped (the run's {SKIPPED_CSV})", file=sys.stderr)
    return record(ctx, skipped, step)


def record(ctx, skipped: list[SkippedFile], step: int | None = None) -> dict[str, float]:
    """``report`` without the terminal lines (the caller has printed them): ``skipped.csv`` and
    the metrics."""
    if skipped:
        ctx.log_text(to_csv(skipped), SKIPPED_CSV)
    counted = metrics(skipped)
    ctx.log_metrics(counted, step=step)
    return counted


def kind_of(exc: BaseException) -> str:
    """The kind of a file that could not be used, from the error reading it raised: its own
    ``kind`` where the reader gave one (flower's PhotoError, video's BadVideo, forest's BadPair),
    else ``missing`` (gone, or a link to nothing), ``unreadable`` (permissions, I/O),
    ``not_file`` (a folder), ``too_large`` (PIL's decompression-bomb guard) or ``corrupt``."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str) and kind:
        return kind
    if type(exc).__name__ == "DecompressionBombError":
        return "too_large"
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, IsADirectoryError):
        return "not_file"
    if isinstance(exc, OSError):
        return "unreadable"
    return "corrupt"


class LeavesFolder(OSError):
    """A file of a data folder that is a link to somewhere outside it: never opened. A folder
    may come from a teammate or a download, and a link in it to ``~/.ssh/id_rsa`` or another
    user's photos would otherwise be read, trained on or copied into the run's outputs."""
    kind = "outside_folder"


def inside_folder(path: str | Path, folder: str | Path) -> Path:
    """``path`` when it (links followed) lies inside ``folder``; else ``LeavesFolder``, which the
    readers skip and count as kind ``outside_folder`` (``kind_of``)."""
    path = Path(path)
    if not path.resolve().is_relative_to(Path(folder).resolve()):
        raise LeavesFolder(f"a link to a file outside {Path(folder).name}/; not followed")
    return path


# --------------------------------------------------------------------------- mode=predict inputs
def listed_inputs(path: str | Path, suffixes: Iterable[str]) -> list[Path]:
    """What a user put in an input folder, as ``orchard.models.batch_predict.input_files`` lists it (the file
    itself, or the folder's non-hidden entries with one of ``suffixes``, by name) but with the
    entries it cannot use kept: links to nothing, unreadable files, folders named like files.
    ``readable`` then sets those aside, counted, instead of dropping them unseen."""
    path = Path(os.path.expanduser(str(path)))
    if not path.is_dir():
        return [path]
    wanted = {s.lower() for s in suffixes}
    return sorted(p for p in path.iterdir() if not p.name.startswith(".")
                  and (not wanted or p.suffix.lower() in wanted) and (p.is_file() or p.is_symlink()))


def readable(paths: Iterable[Path], within: str | Path | None = None) -> tuple[list[Path], list[SkippedFile]]:
    """Split inputs into the files that can be opened for reading and the rest (with their kind
    and reason), before any is staged or predicted: one unreadable file never stops a predict.
    ``within``: what the user named (``input``): a folder, out of which no link is followed
    (``inside_folder``), or a file, taken as named."""
    folder = Path(within) if within is not None and Path(within).is_dir() else None
    good, bad = [], []
    for p in paths:
        try:
            if folder is not None and Path(p).exists():  # a link to nothing: "missing", below
                inside_folder(p, folder)
            with open(p, "rb"):
                pass
            if not Path(p).is_file():
                raise IsADirectoryError(f"not a regular file: {p}")
            good.append(Path(p))
        except OSError as exc:
            reason = "a link to nothing" if Path(p).is_symlink() and not Path(p).exists() else one_line(exc)
            bad.append(SkippedFile(Path(p).name, kind_of(exc), reason))
    return good, bad


def as_rows(skipped: Iterable[SkippedFile], folder: str | Path) -> list[dict]:
    """Inputs set aside before predicting, as rows of ``orchard.models.batch_predict.predict_files`` (``path``,
    ``error``, ``kind``), so the predictions table lists them with the rest of the skipped."""
    return [{"path": str(Path(folder) / s.file), "error": s.reason, "kind": s.kind} for s in skipped]


def from_rows(rows: Iterable[dict]) -> list[SkippedFile]:
    """The skipped inputs of a predict run: rows whose ``error`` is set (``kind`` if the
    predictor gave one)."""
    return [SkippedFile(Path(str(r["path"])).name, str(r.get("kind") or "unreadable"), str(r["error"]))
            for r in rows if r.get("error")]


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
