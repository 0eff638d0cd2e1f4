"""orchard/storage/node_cache.py: the node-local cache that ``Storage.localize`` copies into stays
under its bound, least recently used copies first, the bound travelling into workers."""
from __future__ import annotations

import os

from orchard.storage import evict_node_cache, partial_name, Storage
from tests.orchard.storage.test_atomic import _leftovers


def test_the_node_cache_evicts_least_recently_used_entries_down_to_its_bound(tmp_path):
    root = tmp_path / "node-cache"
    root.mkdir()
    for age, name in enumerate(["newest", "middle", "oldest"]):
        entry = root / name
        entry.mkdir()
        (entry / "tiles.npy").write_bytes(b"\0" * 1000)
        os.utime(entry, (1_000_000 - age * 100, 1_000_000 - age * 100))
    (root / partial_name("copying")).mkdir()                  # a copy still being made: never evicted
    removed = evict_node_cache(2500, keep=root / "middle", root=root)
    assert removed == 1000
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and ".tmp-" not in p.name) == ["middle", "newest"]
    assert len(_leftovers(root)) == 1
    # the entry just used is kept even when it alone is over the bound
    assert evict_node_cache(500, keep=root / "middle", root=root) == 1000
    assert (root / "middle").is_dir() and not (root / "newest").exists()


def test_a_storage_carries_its_node_cache_bound_into_workers(tmp_path):
    import pickle

    from orchard.storage import NODE_CACHE_MAX_BYTES, Storage

    cfg = {"output_dir": str(tmp_path), "storage": {"uri": None, "node_cache_max_gb": 0.5}, "workload": {"name": "flower"}}
    store = pickle.loads(pickle.dumps(Storage.root(cfg).child("tiles")))
    assert store.node_cache_max_bytes == 2**29
    assert Storage(tmp_path).node_cache_max_bytes == NODE_CACHE_MAX_BYTES


def test_copies_from_a_bucket_stay_under_the_node_cache_bound(s3_env, monkeypatch, tmp_path):
    """Three 40 kB folders localized from S3 (a real moto server) under a 100 kB bound: the least
    recently used copy goes, the one just read again stays, and the removed bytes are counted."""
    import os

    from orchard import storage
    from orchard.storage import evicted_bytes

    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ORCHARD_NODE_CACHE", str(tmp_path / "node"))
    monkeypatch.setattr(storage.node_cache, "_cache_held", {})
    store = Storage("s3://orchard/test-node-cache", node_cache_max_bytes=100_000)
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tiles.npy").write_bytes(name.encode() * 40_000)
        store.upload(tmp_path / name, name)
    before = evicted_bytes()
    a, b = store.localize("a"), store.localize("b")
    os.utime(a, (1, 1))                       # a: used long ago
    os.utime(b, (2, 2))
    assert store.localize("a") == a           # a hit refreshes a: b is now the least recently used
    c = store.localize("c")                   # 120 kB > 100 kB: one copy must go
    assert a.is_dir() and c.is_dir() and not b.exists()
    assert evicted_bytes() - before >= 40_000
    assert (store.localize("b") / "tiles.npy").read_bytes() == b"b" * 40_000   # copied again on demand
