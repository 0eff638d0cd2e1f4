"""What a Ray Train worker holds on its GPU, logged as it grows: ``system/w<rank>_gpu_torch_peak_mb``
(torch's caching allocator at its peak, ``max_memory_reserved``), ``system/w<rank>_gpu_other_mb``
(the GPU's memory in use beside this worker's tensors when it started: its CUDA context, and any
other process's) and ``system/w<rank>_gpu_total_mb``, all MiB: resource figures, so under
``system/`` (the UI's "System metrics" tab, never before a run's headline), one per worker as
flower's ``system/w<rank>_gpu_util_pct``; the last two are bookkeeping (one point each).

A sweep whose trials share a GPU sizes how many run at once from these (orchard/sweep/gpu_fit.py);
for a single run they say how much of the GPU the model needed. NVML's device-wide figure
(``system/<node>/gpu<i>/mem_pct``) cannot say it once trials share the GPU: it sums them all.
"""
from __future__ import annotations

from orchard import background

MiB = 2**20


def keys(rank: int) -> tuple[str, str, str]:
    """The worker's (torch peak, memory beside it, GPU total) metric names."""
    return tuple(f"system/w{rank}_gpu_{what}_mb" for what in ("torch_peak", "other", "total"))


class GpuPeak:
    """Reads torch's CUDA allocator every ``interval_s`` in a thread of the worker; logs a value
    only when it grew (a handful of points a run). Nothing where the worker holds no GPU."""

    def __init__(self, ctx, rank: int = 0, interval_s: float = 2.0, cuda=None):
        self.ctx, self.cuda = ctx, cuda
        self.peak_key, self.other_key, self.total_key = keys(rank)
        self.peak, self.step = -1.0, 0
        self._poller = background.Poller(self.read, interval_s, "orchard-gpu-peak")

    def start(self) -> "GpuPeak":
        import ray

        if self.cuda is None:
            if not ray.get_gpu_ids():
                return self
            import torch

            if not torch.cuda.is_available():  # a GPU declared to Ray, a torch without CUDA (gpu_check.py)
                return self
            self.cuda = torch.cuda
        free, total = self.cuda.mem_get_info()
        # at the worker's start nearly all of it is the context and other processes
        other = max(0, total - free - self.cuda.memory_reserved())
        self.ctx.log_metrics({self.other_key: other / MiB, self.total_key: total / MiB}, step=0)
        self._poller.start()
        return self

    def read(self) -> None:
        peak = self.cuda.max_memory_reserved() / MiB
        if peak > self.peak:
            self.peak = peak
            self.ctx.log_metrics({self.peak_key: peak}, step=self.step)
            self.step += 1

    def stop(self) -> None:
        if self.cuda is not None and not self._poller.stopping.is_set():
            self._poller.stop(timeout_s=5)
            self.read()  # the peak at the end, however short the run
