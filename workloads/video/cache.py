"""The cache layer: decoded frames and features, content-addressed, bounded, shared between runs.

The notes choose on-the-fly decoding over pre-extraction (3 TB of video became
50 TB of frames and features) and put a key-value store between the levels. A key is
the video's content digest (sha256 of the file, from the scan) + the segment (offset,
count) + the frame size + the extractor and its options: a renamed or copied file
hits, an edited one misses, and two runs over the same data share entries.
``video.cache`` picks the store:

- ``none``: every epoch decodes and extracts again;
- ``memory``: one Ray actor holds the arrays, LRU-evicted at ``cache_max_mb``; gone with the run;
- ``disk``: one ``.npz`` per entry under ``video.cache_dir`` (default
  ``<storage root>/video/cache/features``, the storage root being ``storage.uri`` or else
  ``output_dir``): persistent across runs, bounded at
  ``cache_max_mb`` with LRU eviction (a hit refreshes the entry's mtime, eviction removes
  the oldest mtimes first), safe for concurrent runs (entries are written to a temporary
  file, fsynced and renamed (``orchard.storage.write_atomic``); eviction holds an exclusive
  ``flock``; a reader that loses an entry to eviction counts a miss and recomputes). A full
  disk costs the entry it refused (not cached, no partial file), never the run. On remote storage (``s3://...``) the entries are
  objects every node reads and writes (orchard/storage/), shared by the runs and nodes on
  that storage; there is no mtime to refresh nor lock to hold, so orchard does not evict
  there: bound the prefix with the store's own expiry rule (an S3 lifecycle rule).

Each entry keeps the seconds it took to compute, so a hit knows the time it saved.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

CACHE_KINDS = ("none", "memory", "disk")


# bumped when the same request would give other arrays: 2, frames scaled by swscale as they are
# converted (decoder.PyAVDecoder._rgb), where cv2 resized the RGB frame before
KEY_VERSION = 2


def cache_key(video: str, offset: int, count: int, size: int, extractor: str, options: str = "") -> str:
    """A stable key; ``video`` is the file's content digest (``VideoIndex.digests``)."""
    raw = f"v{KEY_VERSION}|{video}|{offset}|{count}|{size}|{extractor}|{options}"
    return hashlib.sha1(raw.encode()).hexdigest()


def _to_bytes(array: np.ndarray, compute_s: float) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, array=array, compute_s=np.float64(compute_s))
    return buf.getvalue()


def _from_bytes(data: bytes) -> tuple[np.ndarray, float]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return z["array"], float(z["compute_s"])


class MemoryStore:
    """The in-memory key-value store (run as one Ray actor), least recently used out first."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, tuple[np.ndarray, float]] = OrderedDict()
        self.bytes = 0
        self.evicted = 0

    def get(self, key: str):
        found = self.entries.get(key)
        if found is not None:
            self.entries.move_to_end(key)
        return found

    def put(self, key: str, array: np.ndarray, compute_s: float) -> None:
        if key in self.entries or array.nbytes > self.max_bytes:
            return
        while self.bytes + array.nbytes > self.max_bytes and self.entries:
            _, (old, _) = self.entries.popitem(last=False)
            self.bytes -= old.nbytes
            self.evicted += 1
        self.entries[key] = (array, compute_s)
        self.bytes += array.nbytes

    def size_bytes(self) -> int:
        return self.bytes


def evict_lru(directory: str | os.PathLike, max_bytes: int, keep_fraction: float = 0.9,
              pattern: str = "*/*.npz") -> tuple[int, int]:
    """Delete the least recently used entries (files matching ``pattern``) until the folder holds
    <= ``keep_fraction x max_bytes``.

    Runs under an exclusive lock on ``<directory>/.lock`` (one evictor at a time across
    processes). Returns ``(bytes held after, entries removed)``.
    """
    from filelock import FileLock

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / ".lock"):
        entries = []
        for f in folder.glob(pattern):
            with contextlib.suppress(OSError):
                st = f.stat()
                entries.append((st.st_mtime_ns, st.st_size, f))
        total = sum(e[1] for e in entries)
        removed = 0
        if total > max_bytes:
            for _, size, f in sorted(entries, key=lambda e: e[0]):
                if total <= keep_fraction * max_bytes:
                    break
                with contextlib.suppress(OSError):
                    f.unlink()
                    total -= size
                    removed += 1
        return total, removed


class FeatureCache:
    """A stage's view of the cache: ``get``/``put`` plus hit/miss/time-saved counters.

    Picklable: holds a path or an actor handle, so it travels into Ray Data actors.
    """

    def __init__(self, kind: str, directory: str | None = None, store=None, max_bytes: int = 2**30):
        if kind not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {CACHE_KINDS}")
        self.kind, self.directory, self.store, self.max_bytes = kind, directory, store, int(max_bytes)
        self._held: int | None = None    # this process's estimate of the disk cache's bytes
        self.reset_counters()

    def reset_counters(self) -> None:
        self.hits = self.misses = self.evicted = self.skipped_full = 0
        self.saved_s = 0.0
        self.bytes_written = 0

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def _file(self, key: str) -> Path:
        return Path(self.directory) / key[:2] / f"{key}.npz"

    @property
    def _remote(self):
        """The disk cache's ``Storage`` when it lives in remote storage (``s3://...``), else None."""
        from orchard.api import Storage, is_uri

        return Storage(self.directory) if self.kind == "disk" and is_uri(self.directory) else None

    def get(self, key: str) -> np.ndarray | None:
        """The cached array or None; counts a hit (and the time it saved) or a miss."""
        if not self.enabled:
            return None
        t0 = time.perf_counter()
        found = None
        if self.kind == "memory":
            import ray
            found = ray.get(self.store.get.remote(key))
        elif self._remote is not None:
            try:
                found = _from_bytes(self._remote.read_bytes(f"{key[:2]}/{key}.npz"))
            except (OSError, ValueError):  # absent (pyarrow raises FileNotFoundError): compute it
                found = None
        else:
            f = self._file(key)
            try:
                found = _from_bytes(f.read_bytes())
                os.utime(f)           # recently used: last in line for eviction
            except (OSError, ValueError):  # absent, evicted meanwhile, or a torn write: recompute
                found = None
        if found is None:
            self.misses += 1
            return None
        array, compute_s = found
        self.hits += 1
        self.saved_s += max(0.0, compute_s - (time.perf_counter() - t0))
        return array

    def put(self, key: str, array: np.ndarray, compute_s: float) -> None:
        """Store ``array`` that took ``compute_s`` seconds to make."""
        if not self.enabled:
            return
        if self.kind == "memory":
            self.store.put.remote(key, array, compute_s)
        elif self._remote is not None:
            data = _to_bytes(array, compute_s)
            if len(data) <= self.max_bytes:
                self._remote.write_bytes(f"{key[:2]}/{key}.npz", data)   # one object, published whole
        else:
            data = _to_bytes(array, compute_s)
            if len(data) > self.max_bytes:
                return
            if self._held is None or self._held + len(data) > self.max_bytes:
                # at start and whenever this process's estimate says full: the truth, under the lock
                self._held, removed = evict_lru(self.directory, self.max_bytes - len(data))
                self.evicted += removed
            from orchard.api import StorageFull, write_atomic

            try:
                write_atomic(self._file(key), data)  # readers never see half an entry, nor a full disk a partial one
            except StorageFull:  # a cache is a shortcut: a full disk costs the entry, never the run
                self.skipped_full += 1
                return
            self._held += len(data)
        self.bytes_written += array.nbytes

    def total_bytes(self) -> int:
        """Bytes held by the whole cache (all stages, all actors)."""
        if self.kind == "memory":
            import ray
            return int(ray.get(self.store.size_bytes.remote()))
        if self._remote is not None:
            import pyarrow.fs as pafs

            fs, root = pafs.FileSystem.from_uri(self.directory)
            infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
            return sum(i.size for i in infos if i.type == pafs.FileType.File and i.path.endswith(".npz"))
        if self.kind == "disk" and self.directory and Path(self.directory).exists():
            return sum(f.stat().st_size for f in Path(self.directory).glob("*/*.npz"))
        return 0


def make_cache(kind: str, directory: str | os.PathLike, max_mb: float) -> FeatureCache:
    """Build the run's cache (starts the memory store actor when ``kind == "memory"``).

    ``directory`` is the disk cache's folder (``video.cache_dir``/features), a local path or a
    storage URI (``s3://...``), unused otherwise.
    """
    max_bytes = int(max_mb * 2**20)
    if kind == "memory":
        import ray
        from orchard.api import on_this_node

        store = ray.remote(num_cpus=0)(MemoryStore).options(**on_this_node()).remote(max_bytes)
        return FeatureCache("memory", store=store, max_bytes=max_bytes)
    if kind == "disk":
        return FeatureCache("disk", directory=str(directory), max_bytes=max_bytes)
    return FeatureCache("none")


def cache_dir(cfg: dict):
    """The frame-index store and disk cache (an ``orchard.storage.Storage``): ``video.cache_dir``,
    or ``<storage root>/video/cache`` (``storage.uri``, else ``output_dir``): shared by every run
    on that storage, and by every node."""
    from orchard.api import Storage

    return Storage(cfg["video"].get("cache_dir") or Storage.root(cfg).child("video", "cache"))


def accumulate(totals: dict, stats: dict) -> None:
    """Add the per-stage cache counters of ``stats`` (master.stage_stats) into ``totals``
    (``hits``, ``misses``, ``saved_s``)."""
    for s in stats.values():
        for k in ("hits", "misses", "saved_s"):
            totals[k] += s.get(k, 0)
