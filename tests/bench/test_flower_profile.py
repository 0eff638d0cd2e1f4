"""bench/flower_profile.py's measures: ops' self time from a torch trace, CPU per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def test_the_flower_profile_counts_self_time_per_op_and_cpu_per_process(tmp_path):
    """bench/flower_profile.py's two measures: an op's self time is its duration less that of the
    ops nested in it on its thread (a Chrome trace as the torch profiler writes it), and a
    process's CPU seconds over a window come from psutil's samples (this process, burning CPU)."""
    from bench.flower_profile import CpuAccount, self_times

    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 0, "dur": 10_000, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "ts": 1_000, "dur": 8_000, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": 12_000, "dur": 2_000, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 3_000, "dur": 5_000, "tid": 2},
        {"ph": "X", "cat": "python_function", "name": "not an op", "ts": 0, "dur": 99_000, "tid": 1}]}))
    span, own = self_times(trace)
    assert span == 14.0
    assert own == {"aten::conv2d": 2.0, "aten::convolution": 8.0, "aten::add_": 2.0, "c10d::allreduce_": 5.0}

    busy = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass\nprint(time.process_time())"
    with CpuAccount(every_s=0.1) as cpu:
        start = time.time()
        child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
        spent = float(child.communicate()[0])   # the CPU time the child counted itself
        end = time.time()
        time.sleep(0.3)
    # what psutil saw of it, within the samples' interpolation at the window's ends
    assert spent > 0.1 and abs(cpu.used(child.pid, start, end) - spent) <= 0.3
    assert cpu.group(os.getpid(), set()) == "bench process (driver)"
    assert cpu.group(os.getpid(), {os.getpid()}) == "training workers"
    # Ray's processes by what they are: an actor by its class, whatever method it runs
    cpu.names.update({1: "ray::orchard-sink-5b9e7f92:MetricsSink.log_metrics", 2: "ray::IDLE", 3: "/venv/lib/ray/core/src/ray/raylet/raylet --x",
                      4: "python /venv/lib/ray/_private/workers/default_worker.py --node-ip-address=1"})
    assert [cpu.group(p, set()) for p in (1, 2, 3, 4)] == ["ray::MetricsSink", "idle Ray workers", "Ray: raylet",
                                                           "idle Ray workers"]


def test_a_runs_account_is_its_step_window_its_slowest_worker_and_the_cpu_beside_its_workers():
    from bench.flower_profile import TRAINING, account, top_ops

    class Cpu:  # what CpuAccount.by_group answers for the window: CPU seconds per group of processes
        def by_group(self, workers, start, end):
            assert workers == {11, 12} and (start, end) == (100.0, 130.0)
            return {TRAINING: 40.0, "ray::MetricsSink": 1.5, "Ray: raylet": 0.5}

    ranks = [{"rank": 1, "pid": 12, "first_step_at": 101.0, "last_step_at": 130.0, "steps_s": 29.0, "steps_cpu_s": 20.0},
             {"rank": 0, "pid": 11, "first_step_at": 100.0, "last_step_at": 128.0, "steps_s": 28.0, "steps_cpu_s": 21.0}]
    got = account(ranks, Cpu())
    assert got == {"steps_s": 29.0, "window_s": 30.0, "workers_cpu_s": [21.0, 20.0],
                   "groups": {TRAINING: 40.0, "ray::MetricsSink": 1.5, "Ray: raylet": 0.5}, "beside_workers_s": 2.0}
    assert top_ops({"aten::add_": 1.0, "aten::conv2d": 5.0}, n=1) == "aten::conv2d 5.0"
