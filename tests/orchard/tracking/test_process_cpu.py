"""A process tree's CPU (orchard/tracking/process_cpu.py), as the run's own-CPU sampler counts it:
a process that left the tree (Ray's workers when the raylet stops) still counts as the tree's."""
from __future__ import annotations

import subprocess
import sys
import time


# a child that starts a CPU-bound grandchild and exits when told (a line on its stdin, once the
# test has seen both): the grandchild is re-parented to init, as Ray's workers are when the
# raylet stops, and its CPU must still count as the tree's
ORPHAN = """
import os, sys, time
if os.fork() == 0:
    t = time.process_time()
    while time.process_time() - t < 1.0:
        pass
    os._exit(0)
sys.stdin.readline()
"""


def test_cpu_of_a_process_that_left_the_tree_stays_ours():
    import psutil

    from orchard.tracking.process_cpu import OwnCpu

    child = subprocess.Popen([sys.executable, "-c", ORPHAN], stdin=subprocess.PIPE, text=True)
    own = OwnCpu(psutil.Process(child.pid))  # the child's tree: the test's own CPU is not in it
    tracked, deadline = 0, time.time() + 120
    while (child.poll() is None or len(own.seen) > 0) and time.time() < deadline:  # until the orphan exited
        own.sample()  # sampled often, as the sampler does: only the last moment may be missed
        tracked = max(tracked, len(own.seen))
        if tracked == 2 and child.poll() is None and not child.stdin.closed:
            child.stdin.write("exit\n")  # both seen: the child leaves its grandchild behind
            child.stdin.close()
        time.sleep(0.05)
    assert tracked == 2  # child and grandchild were both seen
    assert own.total >= 0.8, own.total
