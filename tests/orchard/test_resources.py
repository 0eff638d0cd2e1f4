"""Resource sampling: NVML through a fake (no GPU here), psutil for real, summaries."""
import pytest

from orchard.resources import NvmlReader, ResourceSampler, sample_once, summarize
from tests.tiny_workload.fake_nvml import FakeNvml


def test_nvml_reader_reads_every_gpu():
    reader = NvmlReader(FakeNvml())
    assert reader.read() == [{"util_pct": 10.0, "mem_pct": 25.0}, {"util_pct": 90.0, "mem_pct": 75.0}]


def test_no_nvml_means_cpu_only_samples():
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    sample = sample_once("node0", NvmlReader(Broken()))
    assert set(sample) == {"system/node0/cpu_pct", "system/node0/mem_pct"}
    assert 0 <= sample["system/node0/mem_pct"] <= 100


def test_summaries_per_series_and_pooled():
    out = summarize({"gpu/node0/gpu0/util_pct": [10, 30], "gpu/node0/gpu1/util_pct": [90, 90],
                     "system/node0/cpu_pct": [50, 50]})
    assert out["gpu/node0/gpu0/util_pct_mean"] == 20 and out["gpu/node0/gpu0/util_pct_std"] == 10
    assert out["gpu/util_pct_mean"] == pytest.approx(55.0)
    assert out["system/cpu_pct_std"] == 0


def test_sampler_actor_logs_gpu_series_into_the_run(ray_session):
    import ray

    from orchard.context import RunContext
    from orchard.metrics_sink import MetricsSink

    sink = MetricsSink.remote(None, None)
    ctx = RunContext(sink, None, "/tmp", "tiny", "tasks")
    sampler = ResourceSampler.remote(ctx, "node0", 0.05, FakeNvml())
    assert ray.get(sampler.gpu_count.remote()) == 2
    import time

    time.sleep(0.5)
    assert ray.get(sampler.stop.remote()) >= 2
    series = ray.get(sink.series.remote("gpu/"))
    assert set(series["gpu/node0/gpu1/util_pct"]) == {90.0}
    assert summarize(series)["gpu/util_pct_mean"] == pytest.approx(50.0)
