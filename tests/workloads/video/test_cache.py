"""The cache layer: the second epoch over the same segments is served from the cache."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.video.cache import FeatureCache, cache_key, make_cache

from .conftest import pipeline_config


def test_disk_cache_round_trip_and_counters(tmp_path):
    cache = make_cache("disk", tmp_path, max_mb=1)
    key = cache_key(__file__, 3, 5, 32, "flow", "bound=20")
    assert cache.get(key) is None and cache.misses == 1
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    cache.put(key, arr, compute_s=0.5)
    again = FeatureCache("disk", directory=cache.directory)   # another process's view
    assert np.array_equal(again.get(key), arr)
    assert again.hits == 1 and 0 < again.saved_s <= 0.5
    assert cache.total_bytes() > arr.nbytes                    # .npz header + data on disk


def test_keys_differ_by_every_part_of_the_request():
    base = ("a.mp4", 3, 5, 32, "flow", "")
    keys = {cache_key(*base), cache_key("b.mp4", 3, 5, 32, "flow"), cache_key("a.mp4", 4, 5, 32, "flow"),
            cache_key("a.mp4", 3, 6, 32, "flow"), cache_key("a.mp4", 3, 5, 64, "flow"),
            cache_key("a.mp4", 3, 5, 32, "rgb"), cache_key("a.mp4", 3, 5, 32, "flow", "bound=10")}
    assert len(keys) == 7


def test_none_cache_never_hits():
    cache = FeatureCache("none")
    cache.put("k", np.zeros(3), 1.0)
    assert cache.get("k") is None and cache.hits == 0


def test_memory_store_evicts_oldest_first(ray_session):
    import ray

    cache = make_cache("memory", "/nonexistent", max_mb=1 / 1024)    # 1 KiB
    for i in range(3):
        cache.put(f"k{i}", np.full(400, i, np.uint8), 0.1)
    ray.get(cache.store.size_bytes.remote())                          # puts are ordered before this
    assert cache.get("k0") is None                                    # evicted
    assert cache.get("k2") is not None and cache.total_bytes() <= 1024


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_second_epoch_over_the_same_segments_hits_the_cache(ray_session, tiny_videos, tmp_path, kind):
    import ray

    from workloads.video.master import start_master
    from workloads.video.pipeline import build_dataset, collect

    _, index = tiny_videos
    master = start_master(index.labels, index.lengths, seed=0)
    cache = make_cache(kind, tmp_path, max_mb=64)
    segs = [{"video": v, "label": index.labels[v], "offset": 2 * v, "count": 5} for v in range(6)]
    results = []
    for _ in range(2):
        ds = build_dataset(segs, ["flow"], index.paths, index.lengths, pipeline_config(), master, cache)
        feats, meta = collect(ds, "flow", ("video",))
        results.append(feats[np.argsort(meta["video"])])
        results.append(ray.get(master.stage_stats.remote(True)))
    first, first_stats, second, second_stats = results
    assert np.array_equal(first, second)
    assert first_stats["flow"]["hits"] == 0 and first_stats["flow"]["misses"] == 6
    assert second_stats["flow"]["hits"] == 6 and second_stats["decode"]["hits"] == 6
    # the seconds a hit saved are counted (how many depends on the machine's speed that minute:
    # a loaded machine can read an entry slower than it computed it, so no bound beyond >= 0)
    assert second_stats["flow"]["saved_s"] >= 0 and first_stats["flow"]["saved_s"] == 0
    assert cache.total_bytes() > 0


def test_disk_cache_is_bounded_and_evicts_the_least_recently_used(tmp_path):
    entry = np.zeros(10_000, np.uint8)                       # ~10 KB per entry on disk
    cache = make_cache("disk", tmp_path, max_mb=45_000 / 2**20)   # room for 4 entries
    for i in range(4):
        cache.put(f"k{i:02d}" * 5, entry, 0.1)
    import os
    import time
    past = time.time() - 100
    for i in range(4):                                       # k00 oldest ... k03 newest
        os.utime(cache._file(f"k{i:02d}" * 5), (past + i, past + i))
    assert FeatureCache("disk", directory=cache.directory).get("k00" * 5) is not None   # a hit refreshes k00
    cache.put("k04" * 5, entry, 0.1)                         # full: the least recently used go first
    assert cache.total_bytes() <= 45_000
    kept = {k[:3] for k in (f"k{i:02d}" * 5 for i in range(5)) if cache._file(k).exists()}
    assert {"k00", "k03", "k04"} <= kept and "k01" not in kept
    assert cache.evicted >= 1


def _writer(directory: str, start: int, n: int) -> None:
    cache = FeatureCache("disk", directory=directory, max_bytes=200_000)
    for i in range(start, start + n):
        cache.put(f"{i:040d}", np.full(20_000, i % 256, np.uint8), 0.01)


def test_concurrent_writers_keep_the_bound_and_never_leave_half_an_entry(tmp_path):
    import multiprocessing as mp

    procs = [mp.get_context("spawn").Process(target=_writer, args=(str(tmp_path), 100 * k, 40)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    reader = FeatureCache("disk", directory=str(tmp_path), max_bytes=200_000)
    # each writer may overshoot by what it wrote since its last look at the folder: < 3 entries
    assert reader.total_bytes() <= 200_000 + 3 * 21_000
    for f in tmp_path.glob("*/*.npz"):
        array = reader.get(f.stem)
        assert array is not None and (array == int(f.stem) % 256).all()
    assert not list(tmp_path.glob("*/*.tmp*"))


def test_a_full_disk_costs_the_cache_entry_not_the_run(tmp_path):
    """The kernel refuses the write (a child under RLIMIT_FSIZE gets EFBIG, as a full disk gives
    ENOSPC): the entry is not cached, nothing half-written stays, the caller goes on."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    child = textwrap.dedent(f"""
        import resource, signal
        import numpy as np
        from workloads.video.cache import FeatureCache
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        cache = FeatureCache("disk", directory={str(tmp_path)!r}, max_bytes=2**30)
        cache.put("a" * 40, np.zeros(1000, np.uint8), 0.1)           # fits
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        cache.put("b" * 40, np.ones(200_000, np.uint8), 0.1)         # refused by the kernel
        print(cache.skipped_full, cache.get("b" * 40) is None, cache.get("a" * 40).shape)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True", "(1000,)"]
    assert [f.name for f in tmp_path.rglob("*") if f.is_file() and f.name != ".lock"] == ["a" * 40 + ".npz"]


@pytest.mark.slow
def test_a_second_run_over_the_same_data_hits_the_persistent_cache(ray_session, tiny_videos, tmp_path):
    """Two 'runs' (fresh caches, fresh masters) on one cache folder; keys are content digests,
    so a copy of the videos under another name hits too."""
    import shutil

    import ray

    from workloads.video.data import scan
    from workloads.video.master import start_master
    from workloads.video.pipeline import build_dataset, collect

    root, _ = tiny_videos
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    stats = []
    for data in (root, copy):
        index = scan(str(data), seed=0, index_dir=str(tmp_path / "index"))
        master = start_master(index.labels, index.lengths, seed=0)
        cache = make_cache("disk", tmp_path / "features", max_mb=64)
        segs = [{"video": v, "label": index.labels[v], "offset": 2, "count": 5} for v in range(6)]
        ds = build_dataset(segs, ["rgb", "flow"], index.paths, index.lengths, pipeline_config(), master,
                           cache, pts=index.pts, digests=index.digests)
        collect(ds, "flow", ("video",))
        stats.append(ray.get(master.stage_stats.remote(True)))
    first, second = stats
    assert first["flow"]["hits"] == 0 and first["decode"]["misses"] == 6
    assert second["decode"]["hits"] == 6 and second["rgb"]["hits"] == 6 and second["flow"]["hits"] == 6
    assert second["decode"]["saved_s"] >= 0 and second["flow"]["saved_s"] >= 0  # machine-speed dependent: no bound


def test_the_frame_index_store_is_pruned_to_its_bound_least_recently_used_first(tiny_videos, tmp_path):
    """Entries no scan reads any more (files edited, moved or deleted since) go once the store is
    over ``video.index_max_mb``; the entries a scan just read stay, so the next run reuses them."""
    import os

    from workloads.video.data import scan

    root, _ = tiny_videos
    store = tmp_path / "index"
    first = scan(str(root), val_fraction=0.25, seed=0, index_dir=str(store))
    current = sorted(store.glob("*/*.json"))
    assert len(current) == len(first.paths) and first.index_pruned == 0
    held = sum(p.stat().st_size for p in current)
    stale = store / "ff"
    stale.mkdir(exist_ok=True)
    for i in range(40):   # what edited or removed videos left behind, used long ago
        entry = stale / f"ff{i:038d}.json"
        entry.write_text('{"pts": [' + ",".join(["12345"] * 4000) + "]}")
        os.utime(entry, (1, 1))
    again = scan(str(root), val_fraction=0.25, seed=0, index_dir=str(store), index_max_mb=2 * held / 2**20)
    assert again.index_reused == len(first.paths) and again.index_pruned == 40
    assert sorted(store.glob("*/*.json")) == current
    assert scan(str(root), val_fraction=0.25, seed=0, index_dir=str(store),
                index_max_mb=2 * held / 2**20).index_reused == len(first.paths)
