"""The frame index of a video (the pts of every frame) and its content digest, read once and kept
under ``<cache_dir>/index``: a second run over the same files decodes nothing to scan them.  The
store is bounded (``video.index_max_mb``): after each scan the least recently used entries go (a
read refreshes an entry; an edited file's old entry is never read again)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os

from .decoder import BadVideo, build_decoder, file_stat, local_video


# --------------------------------------------------------------------------- the frame index store
def file_digest(path: str, chunk: int = 1 << 20) -> str:
    """sha256 of the file's bytes: the content address of its cache entries."""
    h = hashlib.sha256()
    with open(local_video(path), "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class IndexStore:
    """Per-file probe results (``{kind, reason, digest, pts, size}``), keyed by path, size, mtime,
    in storage (orchard/storage/: a folder, or a bucket shared by the nodes and runs).

    One small JSON per file, written whole: concurrent runs may both write one, never half of
    one. An edited file (new size or mtime) misses and is probed again. Paths are local paths or
    storage URIs (``s3://...``); the store itself is a local folder or a URI.
    """

    def __init__(self, directory: str | os.PathLike | None):
        from orchard.api import Storage

        self.storage = Storage(directory) if directory else None

    def _name(self, path: str) -> str | None:
        from orchard.api import is_uri

        stat = file_stat(path) if self.storage is not None else None
        if stat is None:
            return None
        where = path if is_uri(path) else os.path.abspath(path)
        key = hashlib.sha1(f"{where}|{stat[0]}|{stat[1]}".encode()).hexdigest()
        return f"{key[:2]}/{key}.json"

    def get(self, path: str) -> dict | None:
        name = self._name(path)
        if name is None:
            return None
        try:
            record = json.loads(self.storage.read_bytes(name))
        except (OSError, ValueError):   # absent (pyarrow: FileNotFoundError), or unreadable: probe again
            return None
        if self.storage.is_local:   # used now: last in line when the store is pruned (prune_index)
            with contextlib.suppress(OSError):
                os.utime(self.storage.local_path / name)
        return record

    def put(self, path: str, record: dict) -> None:
        name = self._name(path)
        if name is not None:
            self.storage.write_text(name, json.dumps(record))


def prune_index(index_dir: str | None, max_mb: float | None) -> int:
    """Hold the frame-index store under ``max_mb`` MiB: its least recently used entries are
    removed (``cache.evict_lru``). Returns how many went. A store in remote storage
    (``s3://...``) has no mtime to refresh: bound it with the store's own expiry rule."""
    from orchard.api import Storage

    from .cache import evict_lru

    if not index_dir or not max_mb:
        return 0
    store = Storage(index_dir)
    if not store.is_local or not store.local_path.is_dir():
        return 0
    return evict_lru(store.local_path, int(float(max_mb) * 2**20), pattern="*/*.json")[1]


def probe_file(path: str, decoder, store: IndexStore) -> tuple[dict, bool]:
    """``({kind, reason, digest, pts, size}, reused)`` for one file (a local path or a storage
    URI, copied to this node to decode it); kind ``""`` = a usable video."""
    cached = store.get(path)
    if cached is not None:
        return cached, True
    record = {"kind": "", "reason": "", "digest": "", "pts": [], "size": 0}
    try:
        stat = file_stat(path)
        if stat is None:
            raise BadVideo("missing file", "missing")
        record["size"] = stat[0]
        if stat[0] == 0:
            raise BadVideo("zero-byte file", "empty")
        record["pts"] = decoder.index(path).tolist()
        record["digest"] = file_digest(path)
    except BadVideo as exc:
        record.update(kind=exc.kind, reason=str(exc), pts=[])
    if record["kind"] != "missing":
        store.put(path, record)
    return record, False


def _probe_chunk(paths: list[str], decoder: str, store_dir: str | None) -> list[tuple[dict, bool]]:
    dec, store = build_decoder(decoder), IndexStore(store_dir)
    return [probe_file(p, dec, store) for p in paths]


def probe_all(paths: list[str], decoder: str = "pyav", store_dir: str | None = None,
              chunk: int = 16) -> list[tuple[dict, bool]]:
    """Probe every file; in parallel Ray tasks when Ray is up (one chunk per task)."""
    chunks = [paths[i:i + chunk] for i in range(0, len(paths), chunk)]
    try:
        import ray
        parallel = ray.is_initialized() and len(chunks) > 1
    except ImportError:
        parallel = False
    if parallel:
        task = ray.remote(num_cpus=1)(_probe_chunk)
        results = ray.get([task.remote(c, decoder, store_dir) for c in chunks])
    else:
        results = [_probe_chunk(c, decoder, store_dir) for c in chunks]
    return [r for res in results for r in res]
