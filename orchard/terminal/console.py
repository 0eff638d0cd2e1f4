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

The log rotates by size: past ``max_bytes`` it is renamed ``<name>.1`` (older ones shift to
``.2`` ... ``.<backups>``, the oldest removed) and descriptors 1 and 2 move to a fresh file, so a
process's logs take at most ``(backups + 1) x max_bytes`` of disk, and a run's part (copied into
its folder and the store) at most as much. A log the disk refuses to write never fails a run.
"""
from __future__ import annotations

import builtins
import os
import sys
import threading
import time
from pathlib import Path

from orchard import background
from orchard.config import redact

LOG_MAX_BYTES = 64 * 2**20   # a log file past this rotates (64 MiB)
LOG_BACKUPS = 3              # rotated files kept beside the live one

_terminal: dict = {}       # "out"/"err" -> text streams on the saved terminal descriptors
_log = None                # the log file (text, line-buffered), while quiet
_log_path: Path | None = None
_runs_started = 0          # the first run's log part starts at the process start
_rotation = {"max_bytes": LOG_MAX_BYTES, "backups": LOG_BACKUPS}
_starts: list[int] = [0]   # offsets (since the process start) at which the kept files begin: .N ... .1, live
_rotating = threading.Lock()
_watcher = None   # the Poller that rotates the log for the lines that do not pass here (Ray's, torch's)


def quiet(log_dir: Path, max_bytes: int | None = None, backups: int | None = None) -> Path:
    """Send this process's descriptors 1 and 2 to ``<log_dir>/orchard-<time>-<pid>.log``, rotated
    past ``max_bytes`` with ``backups`` older files kept; returns its path."""
    global _log_path, _watcher
    if _log is not None:
        return _log_path
    _rotation["max_bytes"] = int(max_bytes or LOG_MAX_BYTES)
    _rotation["backups"] = max(0, int(LOG_BACKUPS if backups is None else backups))
    redact.private_folder(log_dir)
    path = log_dir / f"orchard-{time.strftime('%y%m%d-%H%M%S')}-{os.getpid()}.log"
    sys.stdout.flush()
    sys.stderr.flush()
    _terminal["out"] = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    _terminal["err"] = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    _log_path = path
    _point_descriptors_at(path)
    # Ray's and torch's lines reach the file without passing here: a watcher rotates for them too
    _watcher = background.Poller(rotate_if_full, 2.0, "orchard-log-rotation").start()
    return path


def release() -> None:
    """Give descriptors 1 and 2 back to the terminal ``quiet`` saved, and stop logging. A CLI
    process never needs it (it ends quiet); a caller that runs orchard's CLI inside its own
    process (a notebook, a test calling ``orchard.cli.main``) gets its terminal back with it."""
    global _log, _log_path
    if _log is None:
        return
    _watcher.stop(timeout_s=0)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(_terminal["out"].fileno(), 1)
    os.dup2(_terminal["err"].fileno(), 2)
    for stream in (_log, *_terminal.values()):
        stream.close()
    _terminal.clear()
    _log, _log_path = None, None
    _starts[:] = [0]


def _point_descriptors_at(path: Path) -> None:
    global _log
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, redact.PRIVATE_FILE)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    old = _log
    # the log is opened a second time for orchard's own lines: O_APPEND keeps both writers whole
    _log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    if old is not None:
        old.close()


def _rotated(n: int) -> Path:
    return _log_path.with_name(f"{_log_path.name}.{n}")


def rotate_if_full() -> bool:
    """Rotate the log when it has reached ``max_bytes`` (see the module's docstring); True if it did."""
    if _log_path is None:
        return False
    with _rotating:
        try:
            size = _log_path.stat().st_size
            if size < _rotation["max_bytes"]:
                return False
            sys.stdout.flush()
            sys.stderr.flush()
            backups = _rotation["backups"]
            if backups == 0:
                _log_path.unlink()
            else:
                for n in range(backups - 1, 0, -1):
                    if _rotated(n).exists():
                        os.replace(_rotated(n), _rotated(n + 1))
                os.replace(_log_path, _rotated(1))
            _point_descriptors_at(_log_path)
        except OSError:  # a full or read-only disk: keep writing where we are
            return False
        _starts.append(_starts[-1] + size)
        del _starts[:-(backups + 1)]
        return True


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
    """``print`` for orchard's own lines: ``file=sys.stderr`` (or none, stdout) is the terminal.
    URIs' user-info and query values are masked (orchard/config/redact.py): a line may quote an error or
    a store's address, and the terminal and the log are read by more than the run's owner."""
    line = redact.text(sep.join(str(a) for a in args))
    if _log is None:
        builtins.print(line, file=file, end=end, flush=flush)
        return
    text = line + end
    stream = _terminal["err"] if file is sys.stderr else (_terminal["out"] if file in (None, sys.stdout) else file)
    stream.write(text)
    stream.flush()
    if stream in _terminal.values():
        try:
            _log.write(text)
        except (OSError, ValueError):  # a full disk (or a log being rotated): the terminal has the line
            pass


def mark_run_start() -> int:
    """The log offset a run opened now starts at (0 for the process's first run)."""
    global _runs_started
    _runs_started += 1
    if _log_path is None or _runs_started == 1:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    with _rotating:
        return _starts[-1] + _log_path.stat().st_size


def copy_other_log(log: Path, start: int, dest: Path) -> Path:
    """``copy_run_part`` for another process's log (a sweep's trial that Tune killed before its
    run could close): ``log`` from ``start``, or whole with a line saying so where it has been
    rotated since the run began; ``dest`` written whole or not at all."""
    from orchard.storage import atomic_file

    with open(log, "rb") as src, atomic_file(dest) as out:
        rotated = os.fstat(src.fileno()).st_size < start
        if rotated:
            out.write(b"[orchard: the start of this run's log was rotated away]\n")
        _copy_from(src, 0 if rotated else start, out)
    return dest


def _copy_from(src, offset: int, out) -> None:
    src.seek(offset)
    while chunk := src.read(1 << 20):
        out.write(chunk)


def copy_run_part(start: int, dest: Path) -> Path | None:
    """Write the log from ``start`` (an offset ``mark_run_start`` gave) to now into ``dest``, across
    the rotated files still kept (a line says where older ones were removed); None when not quiet.
    ``dest`` is written whole or not at all (``storage.atomic_file``): a full disk leaves no half
    log in the run folder, and raises ``StorageFull`` naming it."""
    from orchard.storage import atomic_file

    if _log_path is None:
        return None
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the log's own disk is full: what did not reach it is lost anyway
            pass
    with _rotating:
        files = [_rotated(n) for n in range(len(_starts) - 1, 0, -1)] + [_log_path]
        segments = list(zip(_starts, files))
    with atomic_file(dest) as out:
        if start < segments[0][0]:
            out.write(f"[orchard: {segments[0][0] - start} bytes of this run's log were rotated away]\n".encode())
        for begin, path in segments:
            try:
                with open(path, "rb") as src:
                    _copy_from(src, max(0, start - begin), out)
            except FileNotFoundError:  # rotated away while we copied
                continue
    return dest
