"""The cache layer: decoded frames and features by (video, offset, count, size, extractor).

The notes choose on-the-fly decoding over pre-extraction (3 TB of video became
50 TB of frames and features) and put a key-value store between the levels. Here
``video.cache`` picks the store:

- ``none``: every epoch decodes and extracts again;
- ``memory``: one Ray actor holds the arrays (bounded by ``cache_max_mb``, FIFO
  eviction); shared by every stage actor, gone with the run;
- ``disk``: one ``.npz`` per entry under the run folder; survives the run and is
  shared by every process on a shared filesystem.

Each entry keeps the seconds it took to compute, so a hit knows the time it saved.
"""
from __future__ import annotations

import hashlib
import io
import os
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

CACHE_KINDS = ("none", "memory", "disk")


def cache_key(path: str, offset: int, count: int, size: int, extractor: str, options: str = "") -> str:
    """A stable key; the file's size and mtime are part of it so an edited video misses."""
    try:
        st = os.stat(path)
        stamp = f"{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        stamp = "?"
    raw = f"{path}|{stamp}|{offset}|{count}|{size}|{extractor}|{options}"
    return hashlib.sha1(raw.encode()).hexdigest()


def _to_bytes(array: np.ndarray, compute_s: float) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, array=array, compute_s=np.float64(compute_s))
    return buf.getvalue()


def _from_bytes(data: bytes) -> tuple[np.ndarray, float]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return z["array"], float(z["compute_s"])


class MemoryStore:
    """The in-memory key-value store (run as one Ray actor)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, tuple[np.ndarray, float]] = OrderedDict()
        self.bytes = 0

    def get(self, key: str):
        return self.entries.get(key)

    def put(self, key: str, array: np.ndarray, compute_s: float) -> None:
        if key in self.entries or array.nbytes > self.max_bytes:
            return
        while self.bytes + array.nbytes > self.max_bytes and self.entries:
            _, (old, _) = self.entries.popitem(last=False)
            self.bytes -= old.nbytes
        self.entries[key] = (array, compute_s)
        self.bytes += array.nbytes

    def size_bytes(self) -> int:
        return self.bytes


class FeatureCache:
    """A stage's view of the cache: ``get``/``put`` plus hit/miss/time-saved counters.

    Picklable: holds a path or an actor handle, so it travels into Ray Data actors.
    """

    def __init__(self, kind: str, directory: str | None = None, store=None):
        if kind not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {CACHE_KINDS}")
        self.kind, self.directory, self.store = kind, directory, store
        self.reset_counters()

    def reset_counters(self) -> None:
        self.hits = self.misses = 0
        self.saved_s = 0.0
        self.bytes_written = 0

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def _file(self, key: str) -> Path:
        return Path(self.directory) / key[:2] / f"{key}.npz"

    def get(self, key: str) -> np.ndarray | None:
        """The cached array or None; counts a hit (and the time it saved) or a miss."""
        if not self.enabled:
            return None
        t0 = time.perf_counter()
        found = None
        if self.kind == "memory":
            import ray
            found = ray.get(self.store.get.remote(key))
        else:
            f = self._file(key)
            if f.exists():
                try:
                    found = _from_bytes(f.read_bytes())
                except (OSError, ValueError):  # a torn write from a killed worker: recompute
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
        else:
            f = self._file(key)
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(_to_bytes(array, compute_s))
            tmp.replace(f)  # atomic: readers never see half an entry
        self.bytes_written += array.nbytes

    def total_bytes(self) -> int:
        """Bytes held by the whole cache (all stages, all actors)."""
        if self.kind == "memory":
            import ray
            return int(ray.get(self.store.size_bytes.remote()))
        if self.kind == "disk" and self.directory and Path(self.directory).exists():
            return sum(f.stat().st_size for f in Path(self.directory).rglob("*.npz"))
        return 0


def make_cache(kind: str, run_dir: str | os.PathLike, max_mb: float) -> FeatureCache:
    """Build the run's cache (starts the memory store actor when ``kind == "memory"``)."""
    if kind == "memory":
        import ray
        store = ray.remote(num_cpus=0)(MemoryStore).remote(int(max_mb * 2**20))
        return FeatureCache("memory", store=store)
    if kind == "disk":
        return FeatureCache("disk", directory=str(Path(run_dir) / "feature_cache"))
    return FeatureCache("none")
