"""Resource sampling: NVML through a fake (no GPU here), psutil for real, summaries."""
import pytest

from orchard.tracking.system_metrics import NvmlReader, ResourceSampler, sample_once, summarize
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


@pytest.mark.slow
def test_sampler_actor_logs_gpu_series_into_the_run(ray_session):
    import ray

    from orchard.tracking.context import RunContext
    from orchard.tracking.sink import MetricsSink

    sink = MetricsSink.remote(None, None)
    ctx = RunContext(sink, None, "/tmp", "tiny", "tasks")
    # GPUs 0 and 1 of this node are held by the run's workers (what launch.py's claim_gpus sends)
    ray.get(sink.claim_gpus.remote(ray.get_runtime_context().get_node_id(), [0, 1]))
    sampler = ResourceSampler.remote(ctx, "node0", 0.05, FakeNvml())
    assert ray.get(sampler.gpu_count.remote()) == 2
    import time

    deadline = time.time() + 120  # until two samples reached the sink, however busy the machine
    while len(ray.get(sink.series.remote("system/")).get("system/node0/gpu1/util_pct", [])) < 2:
        assert time.time() < deadline, "the sampler logged fewer than 2 samples in 120 s"
        time.sleep(0.05)
    assert ray.get(sampler.stop.remote()) >= 2
    series = ray.get(sink.series.remote("system/"))
    assert set(series["system/node0/gpu1/util_pct"]) == {90.0}
    assert summarize(series)["system/gpu_util_pct_mean"] == pytest.approx(50.0)


@pytest.mark.slow
def test_the_drivers_node_is_sampled_by_a_thread_of_this_process_not_an_actor(ray_session):
    """The driver's node's sampler is a thread here (no worker process for a run to start and
    wait for at its end); it reads the run's own CPU and logs into the run, never into what the
    driver's context feeds a sweep. Other nodes' samplers are actors (test_cluster_storage.py
    checks a two-node run has both nodes' series)."""
    import time

    import ray

    from orchard.tracking.context import RunContext
    from orchard.tracking.sink import MetricsSink
    from orchard.tracking.system_metrics import NodeSampler, start_samplers, stop_samplers

    sink = MetricsSink.remote(None, None)
    ctx = RunContext(sink, None, "/tmp", "tiny", "tasks")
    fed = []
    ctx._on_metrics = lambda metrics, step: fed.append(metrics)   # a sweep trial's metric feed
    samplers = start_samplers(ctx, 0.05)
    assert len(samplers) == 1 and isinstance(samplers[0], NodeSampler)
    deadline = time.time() + 120
    while len(ray.get(sink.series.remote("system/")).get("system/node0/run_cpu_pct", [])) < 2:
        assert time.time() < deadline, "the driver's sampler logged fewer than 2 samples in 120 s"
        time.sleep(0.05)
    stop_samplers(samplers)
    assert not samplers[0]._poller.alive() and fed == []
    series = ray.get(sink.series.remote("system/"))
    assert len(series["system/node0/cpu_pct"]) == len(series["system/node0/run_cpu_pct"]) >= 3  # the last one at stop


@pytest.mark.slow  # waits out sqlite's 20 s lock timeout (MLflow's busy_timeout)
def test_metrics_the_store_refused_are_written_by_a_later_flush(ray_session, tmp_path):
    """A store busy with another writer (sqlite locked by a concurrent run) refuses a flush:
    those metrics stay buffered and reach the run once the store answers again."""
    import sqlite3

    import ray
    from mlflow.tracking import MlflowClient

    from orchard.tracking.sink import MetricsSink

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("sink")).info.run_id
    sink = MetricsSink.remote(uri, run_id, 0.2)
    ray.get(sink.ping.remote())
    blocker = sqlite3.connect(tmp_path / "mlflow.db", timeout=60)
    blocker.execute("BEGIN EXCLUSIVE")  # what a concurrent run's long write looks like to this one
    try:
        ray.get([sink.log_metrics.remote({"loss": float(step)}, step, 1000 + step) for step in range(5)])
        with pytest.raises(Exception):  # noqa: B017 - whatever the store's driver raises while locked
            ray.get(sink.flush.remote(), timeout=120)
    finally:
        blocker.rollback()
        blocker.close()
    assert ray.get(sink.close.remote(), timeout=120) >= 0
    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 4]
    ray.kill(sink)


def test_the_runs_own_cpu_counts_its_process_tree_and_not_a_busy_neighbour():
    """``run_cpu_pct`` reads the driver's process tree only: a CPU-bound process outside the tree
    (another user's sweep on the same machine) shows in the machine's ``cpu_pct``, not in it."""
    import subprocess
    import sys
    import time

    from orchard.tracking.system_metrics import RunCpu

    spin = [sys.executable, "-c", "import sys; sys.stdout.write('go\\n'); sys.stdout.flush()\nwhile True: pass"]
    idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    busy = subprocess.Popen(spin, stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline() == "go\n"  # spinning from here on
        ours, neighbour = RunCpu(idle.pid), RunCpu(busy.pid)
        readings, deadline = [], time.time() + 120
        while not readings or max(r[1] for r in readings) < 5.0:  # until the spinner has shown
            assert time.time() < deadline, "the spinning neighbour never showed in 120 s"
            time.sleep(0.2)
            readings.append((ours.read(), neighbour.read()))
        assert max(r[0] for r in readings) < 5.0  # the idle tree stays idle beside it
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
