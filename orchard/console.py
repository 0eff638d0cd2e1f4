"""The console: orchard's own lines on the terminal, everything else in a log file.

A run's terminal shows what its user acts on: the config in one line, the progress line,
warnings that need them, and the summary.  Ray (its raylet and core-worker C++ logs, the
workers' output Ray forwards to the driver), Ray Train, Ray Data, torch and its profiler write
to file descriptors 1 and 2 directly or through ``sys.stdout``/``sys.stderr``; ``quiet`` points
both descriptors at the log file, so none of that reaches the terminal whatever its origin.
orchard's own lines go through ``say``, which writes to the saved terminal and to the log.

Each run opened by this process gets its part of the log (from the process start for the first
run, so Ray's start-up is in it) as ``orchard.log`` in its run folder and as an MLflow artifact.
``verbose=true`` (``-v``) leaves the descriptors alone: everything shows on the terminal as it
comes and no log file is written.
"""
from __future__ import annotations

import builtins
import os
import sys
import time
from pathlib import Path

_terminal: dict = {}       # "out"/"err" -> text streams on the saved terminal descriptors
_log = None                # the log file (text, line-buffered), while quiet
_log_path: Path | None = None
_runs_started = 0          # the first run's log part starts at the process start


def quiet(log_dir: Path) -> Path:
    """Send this process's descriptors 1 and 2 to ``<log_dir>/orchard-<time>-<pid>.log``; returns its path."""
    global _log, _log_path
    if _log is not None:
        return _log_path
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"orchard-{time.strftime('%y%m%d-%H%M%S')}-{os.getpid()}.log"
    sys.stdout.flush()
    sys.stderr.flush()
    _terminal["out"] = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    _terminal["err"] = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # the log is opened a second time for orchard's own lines: O_APPEND keeps both writers whole
    _log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    _log_path = path
    return path


def active() -> bool:
    return _log is not None


def log_path() -> Path | None:
    return _log_path


def terminal(err: bool = True):
    """The stream orchard's own lines go to: the saved terminal while quiet, else sys.stderr/stdout."""
    if _log is None:
        return sys.stderr if err else sys.stdout
    return _terminal["err" if err else "out"]


def say(*args, file=None, sep: str = " ", end: str = "\n", flush: bool = True) -> None:
    """``print`` for orchard's own lines: ``file=sys.stderr`` (or none, stdout) is the terminal."""
    if _log is None:
        builtins.print(*args, file=file, sep=sep, end=end, flush=flush)
        return
    text = sep.join(str(a) for a in args) + end
    stream = _terminal["err"] if file is sys.stderr else (_terminal["out"] if file in (None, sys.stdout) else file)
    stream.write(text)
    stream.flush()
    if stream in _terminal.values():
        _log.write(text)


def mark_run_start() -> int:
    """The log offset a run opened now starts at (0 for the process's first run)."""
    global _runs_started
    _runs_started += 1
    if _log_path is None or _runs_started == 1:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    return _log_path.stat().st_size


def copy_run_part(start: int, dest: Path) -> Path | None:
    """Write the log from ``start`` to now into ``dest``; None when not quiet."""
    if _log_path is None:
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(_log_path, "rb") as src, open(dest, "wb") as out:
        src.seek(start)
        while chunk := src.read(1 << 20):
            out.write(chunk)
    return dest
