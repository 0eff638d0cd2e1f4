"""CPU time of one process tree, counted so that no process ever leaves the sum.

Used twice: by the run's resource sampler (``system/<node>/run_cpu_pct``, the run's own processes
beside the machine's ``cpu_pct``, so that another user's sweep on the same machine does not show
as the run's CPU) and by the benchmarks' load sampler (bench/machine.py: what other processes took
while a bench ran).
"""
from __future__ import annotations

import psutil


class OwnCpu:
    """CPU seconds a process tree used, counted process by process so that none leaves the sum.

    Summing the live tree at two moments loses whatever left it in between: Ray's workers are
    re-parented to init when the raylet that started them is stopped, and a process that exits
    unwaited takes its whole CPU time out of the sum; a 2-core bench then looked "loaded" by its
    own Ray workers. Here a process once seen in the tree stays ours until it exits, and only its
    user + system time is counted (never children_*, which would count a reaped child twice).
    What a process used between the last sample and its exit is missed: sample often.
    """

    def __init__(self, root: psutil.Process):
        self.root = root
        self.seen: dict[tuple[int, float], list] = {}  # (pid, create time) -> [process, CPU s counted]
        self.total = 0.0

    def members(self) -> list[psutil.Process]:
        """The processes counted now: the root and its descendants."""
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> float:
        """CPU seconds of the tree since this tracker was made (first samples count a process whole)."""
        for p in self.members():
            try:
                self.seen.setdefault((p.pid, p.create_time()), [p, 0.0])
            except psutil.Error:
                pass
        for key, entry in list(self.seen.items()):
            try:
                t = entry[0].cpu_times()
            except psutil.Error:  # exited (and reaped): its last counted time stands
                del self.seen[key]
                continue
            cpu = t.user + t.system
            self.total += max(0.0, cpu - entry[1])
            entry[1] = cpu
            try:
                if entry[0].status() == psutil.STATUS_ZOMBIE:  # exited; nobody may ever reap it
                    del self.seen[key]
            except psutil.Error:
                del self.seen[key]
        return self.total
