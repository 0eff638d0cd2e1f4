"""The node-local cache that ``Storage.localize`` copies folders into, bounded by
``storage.node_cache_max_gb``: the least recently used copies go first, and the bytes removed are
counted for the run's ``cache/evicted_bytes``."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from orchard.storage.atomic import _PARTIAL, clean_partials


# --------------------------------------------------------------------------- the node cache
NODE_CACHE_MAX_BYTES = 20 * 2**30   # storage.node_cache_max_gb's default (20 GiB)
_node_cache_cleaned: set[Path] = set()   # roots whose partial copies this process cleaned up
_evicted_bytes = 0                      # removed by this process (cache/evicted_bytes)


def node_cache_dir() -> Path:
    """This node's cache of folders copied from remote storage (``ORCHARD_NODE_CACHE``, or
    ``node-cache`` in this user's own 0700 temp folder, so another user of the node can neither
    read the copies nor plant one). The first use in a process removes the partial copies that
    killed processes of this host left there."""
    from orchard.storage.private_tmp import private_tmp

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
