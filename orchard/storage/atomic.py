"""Writes that survive: every local file goes to a temporary name, is fsynced and renamed into place,
so a kill or a full disk never leaves half a file; a write the disk refuses raises ``StorageFull``
naming the file, and partial files of dead writers are cleaned up (docs/runs.md, "Bounds")."""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import uuid
from pathlib import Path


# --------------------------------------------------------------------------- writes that survive
class StorageFull(OSError):
    """A write refused for want of space (disk full, a quota, a file-size limit). Its text is one
    line naming the file; the previous version of the file is kept and no partial file stays."""

    def __init__(self, code: int, path: str, previous: bool = True):
        kept = "; its previous version is kept" if previous else ""   # a first write had none to keep
        self.line = f"no space left to write {path} ({os.strerror(code)}){kept}"
        super().__init__(self.line)
        self.errno, self.filename, self.previous = code, path, previous

    def __str__(self) -> str:  # OSError's own would be "[Errno 28] None: <path>"
        return self.line

    def __reduce__(self):  # whole across Ray's process boundaries
        return StorageFull, (self.errno, self.filename, self.previous)


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


# where an object's bytes are written before they are copied under its name (write_bytes): one
# prefix per bucket, outside every run's folder, so a listing never meets a half-written object
PARTIAL_PREFIX = ".orchard-partial"


def as_storage_full(exc: BaseException, path: str, remote: bool = False) -> BaseException:
    """``StorageFull`` naming ``path`` for a no-space error (pyarrow's remote errors say so only in
    their text), else ``exc`` itself.  ``remote``: ``path`` is an object in a bucket, whose
    previous version (if any) the failed write left alone."""
    if isinstance(exc, StorageFull):
        return exc
    code = getattr(exc, "errno", None)
    if code not in _NO_SPACE and "No space left on device" in str(exc):
        code = errno.ENOSPC
    if code not in _NO_SPACE:
        return exc
    return StorageFull(code, path, previous=remote or os.path.lexists(path))


_HOST = socket.gethostname().replace("-", "_")


def partial_name(name: str) -> str:
    """The temporary name a file or folder is written under before it is renamed into place: it
    names this host and process, so ``clean_partials`` can tell a dead writer's leftovers from a
    live writer's work."""
    return f"{name}.tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


_PARTIAL = re.compile(r"(?P<name>.+)\.tmp-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]{6}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def clean_partials(folder: Path, name: str | None = None) -> int:
    """Remove what killed writers on this host left in ``folder`` (of the file ``name``, or all):
    partial files and folders whose process is gone. Returns how many went."""
    removed = 0
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return 0
    for entry in entries:
        m = _PARTIAL.fullmatch(entry.name)
        if not m or m["host"] != _HOST or (name is not None and m["name"] != name) or _alive(int(m["pid"])):
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            removed += 1
    return removed


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write a whole local file so that a reader sees the old file or the new one, never half
    (``atomic_file`` with ``data``)."""
    with atomic_file(path) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
    """Write a whole local file from a stream (a log too big to hold in memory): the caller writes
    to the yielded binary file, open under a temporary name in the same folder; on success it is
    fsynced, renamed into place and the folder fsynced (so the rename survives a power loss). A
    write that fails (a full disk: ``StorageFull`` naming the file; anything else: as raised) leaves
    the previous version and no partial file; a writer killed mid-write leaves one, removed by the
    next write of that file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(partial_name(path.name))
    try:
        with open(partial, "xb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        if isinstance(exc, OSError):
            raise as_storage_full(exc, str(path)) from None
        raise
    _fsync_folder(path.parent)
    clean_partials(path.parent, path.name)


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, keep_existing: bool = False):
    """Write a whole local folder so that a reader finds the previous folder or the new one,
    never half of one: the caller fills the yielded temporary path (in the same folder, not yet
    created); on success its files are fsynced and it is renamed into place (a previous folder
    moved aside first, then removed); on any error it is removed and the previous folder stays.
    A writer killed meanwhile leaves a partial folder, removed by the next write of that folder.

    ``keep_existing``: for a folder named by its content (a dataset rendered once per setting),
    one already in place, published by a concurrent writer, is kept and this one dropped."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(partial_name(path.name))
    try:
        yield partial
        for dirpath, _, files in os.walk(partial):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    os.fsync(fh.fileno())
        if keep_existing and path.exists():  # published first by another writer: the same content
            shutil.rmtree(partial, ignore_errors=True)
            return
        old = path.with_name(partial_name(path.name)) if path.exists() else None
        if old is not None:
            os.rename(path, old)
        try:
            os.rename(partial, path)
        except BaseException:
            if old is not None:
                os.rename(old, path)   # the previous folder back in place
            elif keep_existing and path.is_dir():  # published between the look and the rename
                shutil.rmtree(partial, ignore_errors=True)
                return
            raise
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError):
            raise as_storage_full(exc, str(path)) from None
        raise
    _fsync_folder(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    clean_partials(path.parent, path.name)


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems refuse to open a folder: nothing to sync there
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
