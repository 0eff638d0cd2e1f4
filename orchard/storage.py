"""One storage location for everything a run makes and a Ray worker reads (``storage.uri``).

On one machine it is a folder (``output_dir`` by default, today's layout); on a cluster without
a shared disk it is any URI pyarrow's filesystems take: ``s3://bucket/prefix``, ``gs://...``,
``abfs://...``, or a mounted path.  S3-compatible stores (MinIO, Ceph, moto) are reached through
the standard AWS environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``), read by pyarrow on every node.

Layout under the root (the same on a folder and in a bucket)::

    <root>/<workload>/<run key>/...      one run: checkpoints, worker summaries, the model
                                         (the key: its MLflow run id, or run_key())
    <root>/<workload>/<run key>/train/   (flower/video/singa) Ray Train storage of that run
    <root>/flower_data/synthetic-<key>/  content-keyed caches shared by runs and nodes
    <root>/sweeps/<key>/                 Tune's experiment state

A ``Storage`` is a small picklable value (a URI): pass it into Ray tasks, actors and Train
workers, never a driver path.  Workers that need files as files (memory maps, video decoders)
call ``localize()``, which copies a folder once per node into a node-local cache (a local root
is used in place: no copy). That cache is bounded (``storage.node_cache_max_gb``): the least
recently used copies go first (``evict_node_cache``).

Every local file is written whole (``write_atomic``: a temporary name, fsync, rename), so a kill
or a full disk never leaves half a checkpoint for ``resume`` or ``mode=predict`` to read; a write
the disk refuses raises ``StorageFull``, one line naming the file (docs/runs.md, "Bounds").
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path


def _is_uri(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


class Storage:
    """A folder in the run's storage: ``Storage(uri).child("a", "b")``; files are named relative."""

    def __init__(self, uri: str | os.PathLike, node_cache_max_bytes: int | None = None):
        text = str(uri)
        if text.startswith("file://"):
            text = text[len("file://"):]
        if not _is_uri(text):
            text = str(Path(os.path.expanduser(text)).resolve())
        self.uri = text.rstrip("/") or "/"
        self._fs = None
        # the node cache's bound (storage.node_cache_max_gb): carried by the value, so the Ray
        # workers that call localize() apply the run's bound, not a default of their own
        self.node_cache_max_bytes = int(node_cache_max_bytes) if node_cache_max_bytes else NODE_CACHE_MAX_BYTES

    # ------------------------------------------------------------------ construction
    @classmethod
    def root(cls, cfg: dict) -> "Storage":
        """``storage.uri``, or ``output_dir`` when it is unset (the one-machine default)."""
        section = cfg.get("storage") or {}
        max_gb = section.get("node_cache_max_gb")
        return cls(section.get("uri") or cfg["output_dir"],
                   int(float(max_gb) * 2**30) if max_gb is not None else None)

    @classmethod
    def for_run(cls, cfg: dict, run_dir) -> "Storage":
        """The run's own folder in storage: ``<root>/<workload>/<run key>``; with the default root
        and orchard's own run folders this *is* the run folder on the driver."""
        return cls.root(cfg).child(cfg["workload"]["name"], run_key(cfg, run_dir))

    def child(self, *parts: str) -> "Storage":
        return Storage(self._join(*parts), self.node_cache_max_bytes)

    def __getstate__(self):
        return {"uri": self.uri, "_fs": None, "node_cache_max_bytes": self.node_cache_max_bytes}

    def __setstate__(self, state):
        self.__dict__.update({"node_cache_max_bytes": NODE_CACHE_MAX_BYTES, **state})

    def __repr__(self) -> str:
        return f"Storage({self.uri!r})"

    def __str__(self) -> str:
        return self.uri

    def __eq__(self, other) -> bool:
        return isinstance(other, Storage) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    @property
    def is_local(self) -> bool:
        return not _is_uri(self.uri)

    @property
    def local_path(self) -> Path:
        """The folder itself (local roots only)."""
        if not self.is_local:
            raise ValueError(f"{self.uri} is not a local folder")
        return Path(self.uri)

    def _join(self, *parts: str) -> str:
        tail = "/".join(str(p).strip("/") for p in parts if str(p).strip("/"))
        return f"{self.uri}/{tail}" if tail else self.uri

    def _fs_path(self, rel: str = ""):
        """(pyarrow filesystem, path inside it) for ``rel`` under this folder."""
        import pyarrow.fs as pafs

        if self._fs is None:
            if self.is_local:
                self._fs, self._base = pafs.LocalFileSystem(), self.uri
            else:
                self._fs, self._base = pafs.FileSystem.from_uri(self.uri)
        base = self._base.rstrip("/")
        rel = str(rel).strip("/")
        return self._fs, (f"{base}/{rel}" if rel else base)

    # ------------------------------------------------------------------ files
    def exists(self, rel: str = "") -> bool:
        import pyarrow.fs as pafs

        fs, path = self._fs_path(rel)
        return fs.get_file_info(path).type != pafs.FileType.NotFound

    def read_bytes(self, rel: str) -> bytes:
        fs, path = self._fs_path(rel)
        with fs.open_input_stream(path) as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole file; readers see the old file or the new one, never half of it (a
        local file is renamed into place; an object is copied into place in one request)."""
        import uuid

        fs, path = self._fs_path(rel)
        if self.is_local:
            write_atomic(Path(path), data)
            return
        parent = path.rsplit("/", 1)[0]
        # An object store publishes whatever a stream held when it closes, and Arrow closes a
        # stream cut by an error or a signal too (from its destructor): a Ctrl-C mid-write left
        # an empty checkpoint under the real name. The bytes go to a key of their own first.
        partial = f"{path.split('/', 1)[0]}/{PARTIAL_PREFIX}/{uuid.uuid4().hex}"
        try:
            if parent:
                fs.create_dir(parent, recursive=True)
            with fs.open_output_stream(partial) as f:
                f.write(data)
            fs.copy_file(partial, path)
        except OSError as exc:
            raise _as_full(exc, f"{self.uri}/{str(rel).strip('/')}") from None
        finally:
            with contextlib.suppress(OSError):
                fs.delete_file(partial)

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def read_json(self, rel: str):
        return json.loads(self.read_bytes(rel))

    def write_json(self, rel: str, data) -> None:
        self.write_bytes(rel, json.dumps(data).encode())

    def list(self, rel: str = "") -> list[str]:
        """Names directly under ``rel`` (sorted; [] when it does not exist)."""
        import pyarrow.fs as pafs

        fs, path = self._fs_path(rel)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted(i.base_name for i in infos)

    def delete(self, rel: str = "") -> None:
        """Remove a file or a folder (nothing there: nothing to do)."""
        import pyarrow.fs as pafs

        fs, path = self._fs_path(rel)
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)

    # ------------------------------------------------------------------ folders
    def upload(self, local_dir: str | Path, rel: str = "") -> None:
        """Copy a local folder's files to ``rel``; a marker ``_COMPLETE`` is written last, so
        ``complete(rel)`` tells a whole folder from one still being uploaded."""
        local_dir = Path(local_dir)
        for path in _own_files(local_dir):
            self.write_bytes(f"{rel}/{path.relative_to(local_dir).as_posix()}", path.read_bytes())
        self.write_bytes(f"{rel}/_COMPLETE", b"complete\n")  # not empty: some S3 servers refuse empty multipart uploads

    def complete(self, rel: str = "") -> bool:
        return self.exists(f"{rel}/_COMPLETE")

    def ready(self, rel: str = "") -> bool:
        """A whole folder is there: a local folder exists (they are renamed into place whole),
        a remote one carries ``_COMPLETE`` (written last by ``upload``)."""
        return self.exists(rel) if self.is_local else self.complete(rel)

    def download(self, rel: str, local_dir: str | Path) -> Path:
        """Copy the folder ``rel`` into ``local_dir`` (created); returns ``local_dir``.

        Object keys come from whoever can write the bucket: a key that would land outside
        ``local_dir`` (``..``, an absolute key, a link already in the folder) is refused with
        ``UnsafeKey`` before anything is written."""
        import pyarrow.fs as pafs

        fs, path = self._fs_path(rel)
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        files = [info for info in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                 if info.type == pafs.FileType.File]
        targets = [inside(local_dir, info.path[len(path):].lstrip("/"), f"{self.uri}/{rel}".rstrip("/"))
                   for info in files]
        for info, target in zip(files, targets):
            target.parent.mkdir(parents=True, exist_ok=True)
            with fs.open_input_stream(info.path) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        return local_dir

    def localize(self, rel: str = "") -> Path:
        """The folder ``rel`` as a local path on *this* node: the folder itself for a local root,
        else a copy made once per node in ``node_cache_dir()`` (keyed by the URI, renamed into
        place whole, so tasks of several runs on one node share it)."""
        if self.is_local:
            return self.local_path / rel if rel else self.local_path
        uri = self._join(rel)
        key = hashlib.sha1(uri.encode()).hexdigest()[:16]
        target = node_cache_dir() / key
        if target.is_dir():
            _touch(target)
            return target
        partial = target.with_name(partial_name(key))
        try:
            self.download(rel, partial)
        except BaseException as exc:  # a refused key, a lost connection, a full disk: no half folder stays behind
            shutil.rmtree(partial, ignore_errors=True)
            if isinstance(exc, OSError):
                raise _as_full(exc, str(target)) from None
            raise
        try:
            partial.rename(target)
        except OSError:  # another task on this node finished first: use its copy
            shutil.rmtree(partial, ignore_errors=True)
        _cache_grew(_size(target), self.node_cache_max_bytes, target)
        return target

    def local_copy(self, rel: str) -> Path:
        """One file as a local path on this node: the file itself for a local root, else a copy
        in ``node_cache_dir()/<key of this folder>/rel`` (files of one folder stay side by side,
        so ``<stem>_depth.png`` and ``<stem>_labels.png`` keep their common stem)."""
        if self.is_local:
            return self.local_path / rel
        entry = node_cache_dir() / hashlib.sha1(self.uri.encode()).hexdigest()[:16]
        target = inside(entry, str(rel).strip("/"), self.uri)
        if target.is_file():
            _touch(entry)
            return target
        data = self.read_bytes(rel)
        write_atomic(target, data)
        _touch(entry)
        _cache_grew(len(data), self.node_cache_max_bytes, entry)
        return target

    # ------------------------------------------------------------------ Ray Train / Tune
    def train_storage_path(self) -> str:
        """``RunConfig(storage_path=...)``: a local folder or the URI (Ray Train and Tune open
        it with pyarrow, on every node, with the same AWS environment variables)."""
        return self.uri


class UnsafeKey(ValueError):
    """An object key that would be written outside the folder it is downloaded into."""


def inside(folder: Path, key: str, source: str) -> Path:
    """``folder / key``, refused (``UnsafeKey``, naming the key) unless it resolves inside
    ``folder``: no ``..``, no absolute key, no link leading out."""
    root = folder.resolve()
    target = (folder / key).resolve()
    if not key or Path(key).is_absolute() or ".." in Path(key).parts or not target.is_relative_to(root):
        raise UnsafeKey(f"{source}: object {key!r} would be written outside {folder}; refused")
    return folder / key


def is_uri(path) -> bool:
    """``s3://...``, ``gs://...``: a location in a remote store rather than a local path."""
    return _is_uri(str(path))


def _split(uri: str) -> tuple["Storage", str]:
    parent, _, name = str(uri).rstrip("/").rpartition("/")
    return Storage(parent), name


def read_file(path) -> bytes:
    """A whole file, local path or URI."""
    if not is_uri(path):
        return Path(path).read_bytes()
    folder, name = _split(path)
    return folder.read_bytes(name)


def write_file(path, data: bytes) -> None:
    """Write a whole file (published whole: renamed into place, or one object), local path or URI."""
    folder, name = _split(str(path))
    folder.write_bytes(name, data)


def file_exists(path) -> bool:
    if not is_uri(path):
        return Path(path).is_file()
    folder, name = _split(path)
    return folder.exists(name)


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


def _as_full(exc: BaseException, path: str) -> BaseException:
    """``StorageFull`` naming ``path`` for a no-space error (pyarrow's remote errors say so only in
    their text), else ``exc`` itself."""
    if isinstance(exc, StorageFull):
        return exc
    code = getattr(exc, "errno", None)
    if code not in _NO_SPACE and "No space left on device" in str(exc):
        code = errno.ENOSPC
    if code not in _NO_SPACE:
        return exc
    return StorageFull(code, path, previous=is_uri(path) or os.path.lexists(path))


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
            raise _as_full(exc, str(path)) from None
        raise
    _fsync_folder(path.parent)
    clean_partials(path.parent, path.name)


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike):
    """Write a whole local folder so that a reader finds the previous folder or the new one,
    never half of one: the caller fills the yielded temporary path (in the same folder, not yet
    created); on success its files are fsynced and it is renamed into place (a previous folder
    moved aside first, then removed); on any error it is removed and the previous folder stays.
    A writer killed meanwhile leaves a partial folder, removed by the next write of that folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(partial_name(path.name))
    try:
        yield partial
        for dirpath, _, files in os.walk(partial):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    os.fsync(fh.fileno())
        old = path.with_name(partial_name(path.name)) if path.exists() else None
        if old is not None:
            os.rename(path, old)
        try:
            os.rename(partial, path)
        except BaseException:
            if old is not None:
                os.rename(old, path)   # the previous folder back in place
            raise
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _as_full(exc, str(path)) from None
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


# --------------------------------------------------------------------------- the node cache
NODE_CACHE_MAX_BYTES = 20 * 2**30   # storage.node_cache_max_gb's default (20 GiB)
_node_cache_cleaned: set[Path] = set()
_evicted_bytes = 0


def node_cache_dir() -> Path:
    """This node's cache of folders copied from remote storage (``ORCHARD_NODE_CACHE``, or
    ``node-cache`` in this user's own 0700 temp folder, so another user of the node can neither
    read the copies nor plant one). The first use in a process removes the partial copies that
    killed processes of this host left there."""
    from orchard.cluster.private_tmp import private_tmp

    root = Path(os.environ.get("ORCHARD_NODE_CACHE") or private_tmp() / "node-cache")
    root.mkdir(parents=True, exist_ok=True)
    if root not in _node_cache_cleaned:
        _node_cache_cleaned.add(root)
        clean_partials(root)
    return root


def _touch(entry: Path) -> None:
    """Mark a cache entry used now: eviction goes by last use (the entry's mtime)."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def _size(entry: Path) -> int:
    """Bytes under a cache entry (a file or a folder); 0 for one removed meanwhile."""
    if not entry.is_dir():
        try:
            return entry.stat().st_size
        except OSError:
            return 0
    total = 0
    for dirpath, _, files in os.walk(entry):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def evict_node_cache(max_bytes: int, keep: Path | None = None, root: Path | None = None) -> int:
    """Hold the node cache under ``max_bytes``: remove whole entries, least recently used first,
    never ``keep`` (the entry just used) nor partial copies still being written. Returns the bytes
    removed (also summed in ``evicted_bytes()``). Eviction holds an exclusive lock on
    ``<cache>/.lock`` so two processes never remove one entry twice."""
    from filelock import FileLock

    global _evicted_bytes
    root = root or node_cache_dir()
    with FileLock(root / ".lock"):
        entries = []
        for entry in root.iterdir():
            if entry.name.startswith(".") or _PARTIAL.fullmatch(entry.name) or ".tmp-" in entry.name:
                continue
            with contextlib.suppress(OSError):
                entries.append((entry.stat().st_mtime_ns, _size(entry), entry))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, entry in sorted(entries, key=lambda e: e[0]):
            if total <= max_bytes:
                break
            if keep is not None and entry == Path(keep):
                continue
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            total -= size
            removed += size
    _evicted_bytes += removed
    _cache_held[root] = total
    return removed


_cache_held: dict[Path, int] = {}   # cache root -> this process's estimate of the bytes it holds


def _cache_grew(added: int, max_bytes: int, entry: Path) -> None:
    """Count what a copy added; the cache is walked (and evicted) only when this process's
    estimate says it may be over its bound, not at every copy (forest copies files one by one)."""
    root = node_cache_dir()
    if root not in _cache_held:   # first copy of this process: the truth, once
        _cache_held[root] = sum(_size(e) for e in root.iterdir() if not e.name.startswith(".")) - added
    _cache_held[root] += added
    if _cache_held[root] > max_bytes:
        evict_node_cache(max_bytes, keep=entry, root=root)   # sets the estimate to what it left


def evicted_bytes() -> int:
    """Bytes this process removed from its node cache (metric ``cache/evicted_bytes``)."""
    return _evicted_bytes


def run_key(cfg: dict, run_dir) -> str:
    """The name of a run's folder in storage, unique per run folder.

    orchard's own run folders, ``<output_dir>/<workload>/<MLflow run id>``, are unique by their
    name. Any other folder is not: two runs in ``hydra.run.dir=.../A/exp`` and ``.../B/exp`` would
    share checkpoints (Ray Train resumes from whatever its storage holds), so its key adds a digest
    of the folder's full path. Computed from the path alone, so a resume on another machine, from
    another directory, finds the same key from the run's ``orchard.run_dir`` tag."""
    run_dir = Path(os.path.expanduser(str(run_dir)))
    if _RUN_ID.fullmatch(run_dir.name):
        return run_dir.name
    return f"{run_dir.name}-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:10]}"


_RUN_ID = re.compile(r"[0-9a-f]{32}")  # MLflow's run ids (uuid4 hex)


def run_kept(cfg: dict, run_dir) -> bool:
    """The run folder ``run_dir`` (its driver's path) still has its part in storage: a resume
    needs only that, not the driver's folder (gone with the machine on a cluster)."""
    try:
        return Storage.for_run(cfg, run_dir).exists()
    except Exception:  # the store cannot be reached: the caller says the run is gone
        return False


def check(cfg: dict) -> None:
    """Preflight: the storage root can be written (a probe file written and removed); raises
    ``ConfigError("storage.uri", ...)`` with one line."""
    from orchard import ConfigError

    uri = (cfg.get("storage") or {}).get("uri")
    if not uri:
        return  # output_dir, already checked
    if "?" in str(uri):  # every folder of a run is a path joined onto the URI: a query would end up inside it
        raise ConfigError("storage.uri", f"a URI without a query string; {str(uri)!r} has one: set the endpoint "
                          "and region as AWS_ENDPOINT_URL and AWS_DEFAULT_REGION (read on every node), the "
                          "keys as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    storage = Storage(uri)
    probe = f".orchard-probe-{uuid.uuid4().hex[:8]}"
    try:
        storage.write_bytes(probe, b"orchard")
        storage.delete(probe)
    except Exception as exc:  # pyarrow raises OSError / ArrowInvalid with multi-line AWS text
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ConfigError("storage.uri", f"a location orchard can write (AWS_* environment variables for "
                          f"s3://); {uri!r}: {first}") from None


def _own_files(folder: Path) -> list[Path]:
    """The regular files inside ``folder``, sorted; symbolic links are neither followed nor
    copied (a link in a run folder to ``~/.ssh`` or a shared dataset must not put its target in
    the bucket), so what is uploaded is what the folder itself holds."""
    found = []
    for root, dirs, names in os.walk(folder):  # followlinks=False: a linked folder is not walked
        dirs.sort()
        found += [Path(root) / n for n in names if not os.path.islink(os.path.join(root, n))
                  and os.path.isfile(os.path.join(root, n))]
    return sorted(found)

