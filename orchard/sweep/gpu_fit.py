"""How many trials that share a GPU fit in its memory: from the GPU's size and the trials' measured
peaks (issue 49, docs/sweeps.md "Trials that share a GPU").

A fractional GPU share (``strategy.gpus_per_worker=0.125``) is Ray's count for scheduling, not a
slice of the GPU's memory: eight trials of an eighth each all land on one GPU, whatever each
needs. So a sweep whose trials share GPUs (``sweep.fit_gpu_memory``, on by default) starts one
trial alone; its workers log what they hold on the GPU (``orchard/tracking/gpu_peak.py``), the
trial's reports carry it to the sweep's scheduler, and the sweep then runs as many trials at
once as fit in ``USE`` of the GPU's memory, each counted at ``MARGIN`` times the peak seen.

    need per trial   the biggest torch peak any trial reported (a batch-size grid raises it as
                     its bigger trials report) + the smallest memory a worker found in use beside
                     its own at its start (the lone first trial's: the CUDA context and whatever
                     else holds the GPU)
    per GPU          floor(total x USE / (need x MARGIN)), at least 1
    at once          per GPU where the shares would put more than that on one GPU (Ray places a
                     share on any GPU with that much left, so the count must hold for one GPU);
                     else what the shares allow

Plain values only: the scheduler that holds this is saved with the sweep by Tune.
"""
from __future__ import annotations

import math

from orchard.tracking import gpu_peak

# what a trial's first worker logs (orchard/tracking/gpu_peak.py: the trials that share a GPU have
# one), in MiB; a trial's reports carry the last of each
KEYS = TORCH_PEAK, OTHER, TOTAL = gpu_peak.keys(0)
USE = 0.9      # of the GPU's memory: room for the allocator's fragmentation and a driver's own
MARGIN = 1.2   # each trial counted at 1.2x its measured peak: a later epoch, a bigger validation batch


def trials_per_gpu(torch_peak_mb: float, other_mb: float, total_mb: float) -> int:
    """How many trials of this peak one GPU of ``total_mb`` holds (at least 1)."""
    need = max(float(torch_peak_mb) + float(other_mb), 1.0) * MARGIN
    return max(1, math.floor(float(total_mb) * USE / need))


class GpuFit:
    """The sweep's limit from the trials' GPU memory: 1 until a trial reports its peak."""

    def __init__(self, share: float, shares_limit: int, gpus: float):
        self.share, self.shares_limit, self.gpus = float(share), int(shares_limit), float(gpus)
        self.torch_peak, self.other, self.total = 0.0, math.inf, 0.0
        self.limit = 1 if self.shares_limit > 1 else self.shares_limit
        self.measured = False

    def seen(self, result: dict) -> str | None:
        """Take a trial's report; a line for the console when the limit changed."""
        peak, other, total = (result.get(k) for k in KEYS)
        if peak is None or other is None or not total:
            return None
        grew = float(peak) > self.torch_peak or float(other) < self.other or not self.measured
        if not grew:
            return None
        self.torch_peak = max(self.torch_peak, float(peak))
        self.other, self.total, self.measured = min(self.other, float(other)), float(total), True
        return self._set(self._limit())

    def ended_unmeasured(self) -> str | None:
        """A trial finished without any trial having reported GPU memory (a workload whose workers
        log none, or torch without CUDA on a GPU declared to Ray): the shares alone decide."""
        if self.measured or self.limit >= self.shares_limit:
            return None
        self.limit = self.shares_limit
        return (f"orchard: sweep: no trial reported its GPU memory ({TORCH_PEAK}); up to {self.limit} "
                f"trial(s) at once, as their GPU shares allow")

    def _limit(self) -> int:
        per_gpu = trials_per_gpu(self.torch_peak, self.other, self.total)
        by_shares = math.floor(1.0 / self.share + 1e-9)
        return self.shares_limit if per_gpu >= by_shares else min(self.shares_limit, per_gpu)

    def _set(self, limit: int) -> str | None:
        if limit == self.limit:
            return None
        before, self.limit = self.limit, limit
        need = self.torch_peak + self.other
        line = (f"orchard: sweep: a trial needs {need / 1024:.2f} GiB of the GPU's {self.total / 1024:.1f} GiB "
                f"(torch's peak {self.torch_peak:.0f} MiB + {self.other:.0f} MiB beside it): up to {limit} "
                f"trial(s) at once (was {before}; each counted at {MARGIN:g}x, within {USE:.0%} of the GPU)")
        per_gpu = trials_per_gpu(self.torch_peak, self.other, self.total)
        if self.gpus >= 2 and limit < self.shares_limit:
            line += (f"; to run {per_gpu} on each of the {self.gpus:g} GPUs, give each trial "
                     f"{1 / per_gpu:.3g} of a GPU")
        return line
