"""What a Ray Train worker logs of its GPU (orchard/tracking/gpu_peak.py), with a stand-in for
torch.cuda: the GPU is what cannot exist here. The sweep reads these figures to size the trials
that share a GPU (tests/orchard/sweep/test_gpu_fit.py)."""
from __future__ import annotations

from orchard.tracking.gpu_peak import GpuPeak
from orchard.tracking.gpu_peak import keys as gpu_peak_keys

MiB = 2**20


class FakeCuda:
    """torch.cuda's allocator figures: 80 GB, 700 MB in use before the worker's tensors."""

    def __init__(self):
        self.reserved, self.peak = 0, 0

    def mem_get_info(self):
        return 80_000 * MiB - 700 * MiB - self.reserved, 80_000 * MiB

    def memory_reserved(self):
        return self.reserved

    def max_memory_reserved(self):
        return self.peak


class Ctx:
    def __init__(self):
        self.logged = []

    def log_metrics(self, values, step=0):
        self.logged.append((step, dict(values)))


def test_a_worker_logs_what_it_found_on_its_gpu_once_and_its_peak_as_it_grows():
    cuda, ctx = FakeCuda(), Ctx()
    peak = GpuPeak(ctx, rank=1, interval_s=60, cuda=cuda).start()
    assert ctx.logged == [(0, {"system/w1_gpu_other_mb": 700.0, "system/w1_gpu_total_mb": 80_000.0})]
    cuda.peak = 1_500 * MiB
    peak.read()
    peak.read()  # no growth: nothing logged
    cuda.peak = 2_000 * MiB
    peak.stop()  # the last peak, however short the run
    assert ctx.logged[1:] == [(0, {"system/w1_gpu_torch_peak_mb": 1_500.0}),
                              (1, {"system/w1_gpu_torch_peak_mb": 2_000.0})]


def test_the_gpu_a_worker_found_is_bookkeeping_its_peak_a_system_chart():
    from orchard.tracking import bookkeeping

    assert [bookkeeping.is_bookkeeping(k) for k in gpu_peak_keys(3)] == [False, True, True]


def test_a_worker_without_a_gpu_logs_nothing(ray_session):
    ctx = Ctx()
    GpuPeak(ctx).start().stop()  # the driver of this test holds no GPU id
    assert ctx.logged == []
