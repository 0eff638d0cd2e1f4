"""Ring and ps under the same Ray Train launcher: ps-sync follows exactly the same trajectory
as ring all-reduce. Async parameter servers training, and a worker that dies mid-run replaced
with the run going on from its last checkpoint, are proved on a real workload by flower's smoke
runs (tests/workloads/flower/test_run.py: ps-async, and ring with ``flower.fail_at_epoch=1``),
through this same launcher."""

import os

import pytest
import torch

from orchard.tracking.context import RunContext
from orchard.strategies import launch, worker

OPT = {"name": "sgd", "lr": 0.05, "momentum": 0.5}


def regression_loop(config):
    env = worker.env(config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    rep = worker.replica(model, OPT, config)
    start = 0
    restored = worker.load_checkpoint()
    if restored:
        state, epoch = restored
        rep.load_state_dict(state)
        start = epoch + 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    xs, ys = env.shard(x), env.shard(y)
    for epoch in range(start, config["epochs"]):
        for i in range(0, len(xs), 8):
            loss = ((rep.model(xs[i:i + 8]) - ys[i:i + 8]) ** 2).mean()
            rep.zero_grad()
            loss.backward()
            rep.step()
        with torch.no_grad():
            full = ((rep.module(x) - y) ** 2).mean().item()
        config["ctx"].log_metrics({"train/loss": full, "train/epoch": epoch, "train/nice": os.nice(0)}, step=epoch)
        worker.save_checkpoint(rep.state_dict(), {"loss": full}, epoch)


def _run(ray_session, tmp_path, strategy, **loop):
    from orchard.tracking.sink import MetricsSink

    sink = MetricsSink.remote(None, None)
    ctx = RunContext(sink, None, str(tmp_path), "test", strategy["name"])
    cfg = {"strategy": {"cpus_per_worker": 1, "max_failures": 2, **strategy}}
    result = launch(regression_loop, {"optimizer": OPT, "epochs": 3, **loop}, cfg, ctx, name=f"t-{strategy['name']}")
    return result, ray_session.get(sink.last_values.remote())


@pytest.mark.slow
def test_ps_sync_equals_ring(ray_session, tmp_path):
    # the ring's workers also yield their CPU (strategy.worker_niceness), which changes no number
    ring, ring_last = _run(ray_session, tmp_path / "ring", {"name": "ring", "num_workers": 2, "worker_niceness": 3})
    sync, sync_last = _run(ray_session, tmp_path / "sync", {"name": "ps", "num_workers": 2, "num_servers": 2, "mode": "sync"})
    assert ring.metrics["loss"] == pytest.approx(sync.metrics["loss"], rel=1e-4)
    assert ring_last["train/nice"] == min(19, sync_last["train/nice"] + 3)
    # 3 epochs x 4 steps, applied once per step (not per worker) on each of the 2 shards
    assert sync_last["wire/ps_updates"] == 3 * 4 * 2


def test_a_placement_group_whose_creator_actor_died_is_freed_and_the_drivers_are_kept(ray_session):
    """What Tune leaves when its scheduler stops a trial: the trial's Ray Train controller (an
    actor) dies with the trial, and Ray keeps its worker group's reservation while the job lives."""
    import time

    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import placement_group, remove_placement_group

    from orchard.strategies.launch import free_orphaned_placement_groups

    @ray.remote(num_cpus=0)
    class Controller:
        def reserve(self):
            group = placement_group([{"CPU": 1}])
            ray.get(group.ready(), timeout=60)
            return group.id.hex()

    ours = placement_group([{"CPU": 0.5}])  # the driver's own (Tune's trial groups): never touched
    ray.get(ours.ready(), timeout=60)
    controller = Controller.remote()
    orphan = ray.get(controller.reserve.remote())
    ray.kill(controller)
    deadline = time.time() + 60
    while placement_group_table()[orphan]["state"] != "CREATED" or not _creator_dead(orphan):
        assert time.time() < deadline
        time.sleep(0.2)
    assert free_orphaned_placement_groups() == 1
    assert placement_group_table()[orphan]["state"] == "REMOVED"
    assert placement_group_table()[ours.id.hex()]["state"] == "CREATED"
    remove_placement_group(ours)


def _creator_dead(group_hex: str) -> bool:
    from ray._private import state
    from ray.core.generated import gcs_pb2

    for raw in state.state._connect_and_get_accessor().get_placement_group_table():
        group = gcs_pb2.PlacementGroupTableData.FromString(raw)
        if group.placement_group_id.hex() == group_hex:
            return group.creator_actor_dead
    return False


@pytest.mark.slow
def test_an_elastic_group_that_can_never_start_fails_in_one_line(ray_session, tmp_path, monkeypatch):
    """Ray Train's elastic groups wait without a bound for their minimum (strategy.min_workers);
    orchard keeps the start bound (cluster.worker_start_timeout_s) there too."""
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    from orchard.strategies.launch import WorkersDidNotStart

    with pytest.raises(WorkersDidNotStart, match=r"^3 Ray Train workers \(1 CPU each\) did not start within 5 s"):
        _run(ray_session, tmp_path, {"name": "ring", "num_workers": 4, "min_workers": 3})  # the session has 2 CPUs
