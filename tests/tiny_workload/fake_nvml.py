"""A stand-in for NVML (the one thing that cannot exist on a CPU machine): two GPUs whose
utilization follows a fixed sequence, so the sampler's series and summaries can be checked."""
from types import SimpleNamespace


class FakeNvml:
    def __init__(self, utils=(10.0, 90.0), mem_used=(2.0, 6.0), mem_total=8.0):
        self.utils, self.mem_used, self.mem_total = utils, mem_used, mem_total
        self.calls = 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.utils)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.calls += 1
        return SimpleNamespace(gpu=self.utils[handle], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.mem_used[handle], total=self.mem_total, free=self.mem_total - self.mem_used[handle])
