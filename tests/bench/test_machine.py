"""The bench's load sampler (bench/machine.py): only other processes' CPU makes a run loaded."""
from __future__ import annotations

import os


def test_only_other_processes_cpu_makes_a_run_loaded():
    from bench.machine import LoadSampler

    cores = os.cpu_count()
    # the bench itself keeping every core busy is not load; the same busy time from others is
    assert LoadSampler._foreign(busy_s=cores * 10.0, own_s=cores * 10.0, wall_s=10.0) == 0.0
    assert LoadSampler._foreign(busy_s=cores * 10.0, own_s=0.0, wall_s=10.0) == cores
    assert LoadSampler._foreign(busy_s=5.0, own_s=-30.0, wall_s=10.0) == 0.5  # never below zero
