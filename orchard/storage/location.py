"""The storage location itself: a ``Storage`` (a folder or a pyarrow/fsspec URI, picklable, opened by
every node for itself), the checks on keys read back from it, and where a run's own files go
(``run_key``, ``run_kept``) and ``check`` before Ray starts."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path

from orchard.storage.atomic import as_storage_full, partial_name, PARTIAL_PREFIX, write_atomic
from orchard.storage.node_cache import _cache_grew, _size, _touch, node_cache_dir, NODE_CACHE_MAX_BYTES


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

    @classmethod
    def previous_run(cls, cfg: dict) -> "Storage | None":
        """The storage of the run this one continues: the workload section's ``resume`` key names
        that run's folder (set by ``python -m orchard resume <run id>``, or typed), or None. A key
        naming a file of this machine (forest takes a checkpoint file) has no run storage: None.
        Built here, once, for the resume checks and for ``ctx.previous_storage``."""
        previous = (cfg.get(cfg["workload"]["name"]) or {}).get("resume")
        if not previous or (not _is_uri(str(previous)) and Path(os.path.expanduser(str(previous))).is_file()):
            return None
        return cls.for_run(cfg, previous)

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
            raise as_storage_full(exc, f"{self.uri}/{str(rel).strip('/')}", remote=True) from None
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
                raise as_storage_full(exc, str(target)) from None
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


PROBE_WAIT_S = 30.0   # the preflight's write, copy and delete of one small object


def check(cfg: dict) -> None:
    """Preflight: the storage root can be written (a probe file written and removed); raises
    ``ConfigError("storage.uri", ...)`` with one line."""
    from orchard import background
    from orchard.errors import ConfigError

    uri = (cfg.get("storage") or {}).get("uri")
    if not uri:
        return  # output_dir, already checked
    if "?" in str(uri):  # every folder of a run is a path joined onto the URI: a query would end up inside it
        raise ConfigError("storage.uri", f"a URI without a query string; {str(uri)!r} has one: set the endpoint "
                          "and region as AWS_ENDPOINT_URL and AWS_DEFAULT_REGION (read on every node), the "
                          "keys as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    storage = Storage(uri)
    probe = f".orchard-probe-{uuid.uuid4().hex[:8]}"

    def write_and_remove() -> None:
        storage.write_bytes(probe, b"orchard")
        storage.delete(probe)

    try:  # bounded: pyarrow's GCS client retried an unreachable bucket 16 min and on, deaf to Ctrl-C
        background.bounded(write_and_remove, timeout_s=PROBE_WAIT_S, name="orchard-storage-check")
    except TimeoutError:
        raise ConfigError("storage.uri", f"a location orchard can write; {uri!r} did not answer within "
                          f"{PROBE_WAIT_S:g} s (the bucket, its credentials, the network)") from None
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
