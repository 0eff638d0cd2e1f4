"""workloads/flower/throughput.py: what the workers' summaries add up to."""
from __future__ import annotations


def test_cache_evicted_bytes_adds_the_drivers_and_each_workers_once():
    """``cache/evicted_bytes``: the driver's evictions and each Train worker's (from its summary);
    a worker in the driver's own process (local mode) is already in the driver's count."""
    import os

    from workloads.flower.throughput import cache_evicted

    workers = [{"rank": 0, "cache_evicted_bytes": 300, "pid": os.getpid() + 1},
               {"rank": 1, "cache_evicted_bytes": 40, "pid": os.getpid() + 2},
               {"rank": 2, "cache_evicted_bytes": 7, "pid": os.getpid()},
               {"rank": 3}]   # a summary from before the count existed (a resumed run's)
    assert cache_evicted(workers, 1000) == 1340.0
