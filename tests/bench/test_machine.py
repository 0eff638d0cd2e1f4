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


def test_a_pause_of_the_machine_marks_the_bench_loaded(monkeypatch):
    """A VM paused and resumed (snapshot, fork) steps the wall clock past the monotonic one: the
    sampler records the step and the figures are not called clean."""
    import time

    from bench import machine

    sampler = machine.LoadSampler()
    sampler.before, sampler._started = {"load1": 0.0, "busy_cores": 0.0}, time.time()
    sampler._window = (0.0, 0.0, time.monotonic())
    sampler._sample()
    assert sampler.pauses == [] and not sampler.summary()["loaded"]
    real = time.time
    monkeypatch.setattr(machine.time, "time", lambda: real() + 19.0)  # the same monotonic moment, 19 s later
    sampler._sample()
    summary = sampler.summary()
    assert summary["paused_s"] == [19.0] and summary["loaded"]
