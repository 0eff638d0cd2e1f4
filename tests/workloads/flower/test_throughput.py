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


def test_a_wall_clock_step_between_driver_and_worker_never_takes_the_steps_out_of_the_split():
    """The group's start compares the driver's wall clock with a worker's; when the clock stepped
    between them (a VM paused and resumed: once ~19 s inside a bench run) it is the piece that
    shrinks to what is left, and the steps the worker timed itself stay in the split."""
    from orchard.tracking.time_split import TimeSplit
    from workloads.flower.throughput import time_split, training_parts

    worker = {"completion_s": 5.0, "first_step_at": 1000.0 + 32.3, "steps_s": 2.4, "loop_start_s": 2.4,
              "checkpoint_s": 0.1}
    metrics = time_split([worker], train_started=1000.0)  # the worker's first step "32.3 s" after launch
    split = TimeSplit(started=0.0)
    split.parts, split._last = {"training": 16.3}, 16.3  # what the driver's monotonic clock saw
    split.carve("training", training_parts(metrics))
    assert split.parts["steps"] == 2.4 and split.parts["first_step"] == 2.4 and split.parts["checkpoints"] == 0.1
    assert abs(sum(split.parts.values()) - 16.3) < 1e-9 and split.parts["training"] == 0.0
