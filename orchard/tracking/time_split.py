"""Where a run's seconds went: its wall clock cut into consecutive parts that add up to the whole.

The driver marks the end of each part as it leaves it (``mark``): the time since the previous
mark goes to the part named, so every second of the run is in exactly one part and the parts
add up to ``time/total_s`` by construction. The lifecycle marks its own parts (Ray's start,
opening the store and the run's services, closing); a workload marks its numbered steps through
its context (``ctx.mark("data")``, ``ctx.mark("training")``, ...), and where its workers say
what a part held (a worker group's start, the steps, checkpoints), ``carve`` moves those seconds
out of it into parts of their own. A part nobody marked is not invented: what a workload left
unmarked is in the next part it marks, or ``close``.

Logged as ``time/split/<part>_s`` with the final metrics; the summary prints one line of it.
"""
from __future__ import annotations

import time

PREFIX = "time/split/"

# the parts in the order a run meets them (the summary line's order); a part not listed goes last
ORDER = ("ray_start", "store_open", "data", "worker_group_start", "first_step", "steps", "validation",
         "checkpoints", "training", "evaluation", "predict", "model", "figures", "close")
# the summary's short names, where the metric's own name is long
SHORT = {"ray_start": "ray", "store_open": "store", "worker_group_start": "group start",
         "first_step": "to first step"}


class TimeSplit:
    """The run's parts so far (seconds by name), from ``started`` (``time.perf_counter()``)."""

    def __init__(self, started: float | None = None):
        self.started = time.perf_counter() if started is None else started
        # the same moment on the wall clock (seconds since the epoch): where another process's
        # clock meets this split (the run's tag ``orchard.started_at``; bench/orchard_overhead.py)
        self.started_at = time.time() - (time.perf_counter() - self.started)
        self._last = self.started
        self.parts: dict[str, float] = {}

    def mark(self, part: str) -> float:
        """The time since the previous mark (or the start) was spent on ``part``; returns it."""
        now = time.perf_counter()
        spent, self._last = now - self._last, now
        self.parts[part] = self.parts.get(part, 0.0) + spent
        return spent

    def carve(self, whole: str, pieces: dict[str, float]) -> None:
        """Move seconds out of part ``whole`` into ``pieces`` (what the workers measured inside it),
        in the order given, never more than ``whole`` holds: the sum stays the run's wall time."""
        left = self.parts.get(whole, 0.0)
        for part, seconds in pieces.items():
            take = min(max(float(seconds or 0.0), 0.0), left)
            if take > 0:
                self.parts[part] = self.parts.get(part, 0.0) + take
                left -= take
        if whole in self.parts:
            self.parts[whole] = left

    def total(self) -> float:
        """The seconds marked so far: the parts' sum."""
        return self._last - self.started

    def metrics(self) -> dict[str, float]:
        return {f"{PREFIX}{part}_s": seconds for part, seconds in self.parts.items()}


def line(metrics: dict) -> str | None:
    """The split as the summary prints it: ``ray 3.1, store 0.6, data 1.2, ... s``; None without one."""
    parts = {k[len(PREFIX):-2]: v for k, v in metrics.items()
             if k.startswith(PREFIX) and k.endswith("_s") and isinstance(v, (int, float))}
    if not parts:
        return None
    ordered = sorted(parts, key=lambda p: (ORDER.index(p) if p in ORDER else len(ORDER), p))
    return ", ".join(f"{SHORT.get(p, p.replace('_', ' '))} {parts[p]:,.1f}" for p in ordered) + " s"
