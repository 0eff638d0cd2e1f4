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
    out = summarize({"system/node0/gpu0/util_pct": [10, 30], "system/node0/gpu1/util_pct": [90, 90],
                     "system/node0/cpu_pct": [50, 50]})
    assert out["system/node0/gpu0/util_pct_mean"] == 20 and out["system/node0/gpu0/util_pct_std"] == 10
    assert out["system/gpu_util_pct_mean"] == pytest.approx(55.0)
    assert out["system/cpu_pct_std"] == 0


def test_only_gpus_claimed_by_the_runs_workers_are_sampled():
    sample = sample_once("node0", NvmlReader(FakeNvml()), {1})
    assert "system/node0/gpu1/util_pct" in sample and "system/node0/gpu0/util_pct" not in sample
    assert not any("gpu" in k for k in sample_once("node0", NvmlReader(FakeNvml()), set()))


def test_sampler_actor_logs_gpu_series_into_the_run(ray_session):
    import ray

    from orchard.context import RunContext
    from orchard.metrics_sink import MetricsSink

    sink = MetricsSink.remote(None, None)
    ctx = RunContext(sink, None, "/tmp", "tiny", "tasks")
    # GPUs 0 and 1 of this node are held by the run's workers (what launch.py's claim_gpus sends)
    ray.get(sink.claim_gpus.remote(ray.get_runtime_context().get_node_id(), [0, 1]))
    sampler = ResourceSampler.remote(ctx, "node0", 0.05, FakeNvml())
    assert ray.get(sampler.gpu_count.remote()) == 2
    import time

    time.sleep(0.5)
    assert ray.get(sampler.stop.remote()) >= 2
    series = ray.get(sink.series.remote("system/"))
    assert set(series["system/node0/gpu1/util_pct"]) == {90.0}
    assert summarize(series)["system/gpu_util_pct_mean"] == pytest.approx(50.0)
