"""The parameter servers (orchard/strategies/ps.py): shards balanced and deterministic, sampled
pushes, the same update rule on flat shards as per tensor, async averaging, and a sync barrier
that follows the group's size."""
import time

import numpy as np
import pytest

from orchard.strategies.optimizers import NumpyOptimizer
from orchard.strategies.ps import assign_shards, sampled_names


def test_shards_are_balanced_and_deterministic():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 10}
    first = assign_shards(sizes, 2)
    assert first == assign_shards(dict(reversed(list(sizes.items()))), 2)
    load = [sum(s for n, s in sizes.items() if first[n] == k) for k in range(2)]
    assert sorted(load) == [110, 110]  # 100+10 and 60+50


def test_parameter_sampling_covers_every_parameter():
    names = [f"p{i}" for i in range(10)]
    seen = set()
    for step in range(4):
        picked = sampled_names(names, 0.3, step, worker=0)
        assert len(picked) == 3
        seen |= set(picked)
    assert seen == set(names)


def test_sampled_push_answers_only_the_pushed_parameters(ray_session):
    import numpy as np

    from orchard.strategies.ps import PSClient, PSGroup

    params = {"a": np.ones(4, np.float32), "b": np.ones(2, np.float32), "c": np.ones(3, np.float32)}
    group = PSGroup.create(params, num_servers=2, num_workers=1, mode="async", optimizer={"name": "sgd", "lr": 0.5})
    client = PSClient(group, 0)
    fresh = client.push_pull({"a": np.ones(4, np.float32)}, step=0, only_pushed=True)
    assert set(fresh) == {"a"} and np.allclose(fresh["a"], 0.5)
    full = client.push_pull({"b": np.ones(2, np.float32)}, step=1)
    assert set(full) >= {"b"} and np.allclose(full["b"], 0.5)
    assert np.allclose(client.pull()["c"], 1.0)
    group.shutdown()


@pytest.mark.parametrize("spec", [{"name": "adam", "lr": 0.05}, {"name": "sgd", "lr": 0.1, "momentum": 0.9}])
def test_flat_shards_apply_the_same_rule_as_per_tensor_updates(ray_session, spec):
    """Servers keep each shard as one flat vector; full pushes take one vectorized update and
    sampled pushes update slices. Both must equal per-tensor updates of the same pushes."""
    from orchard.strategies.ps import PSClient, PSGroup

    rng = np.random.default_rng(1)
    params = {n: rng.normal(size=s).astype(np.float32) for n, s in
              [("conv.w", (4, 3, 3)), ("conv.b", (4,)), ("fc.w", (5, 6)), ("fc.b", (5,))]}
    group = PSGroup.create(params, num_servers=2, num_workers=1, mode="async", optimizer=spec)
    client = PSClient(group, 0)
    reference, expected = NumpyOptimizer(spec), dict(params)
    for step, names in enumerate([list(params), ["fc.w"], list(params), ["conv.b", "fc.b"], list(params)]):
        grads = {n: rng.normal(size=params[n].shape).astype(np.float32) for n in names}
        fresh = client.push_pull(grads, step)
        expected = reference.apply(expected, grads)
        assert set(names) <= set(fresh)  # a push answers at least the pushed shards
        for n in fresh:
            np.testing.assert_allclose(fresh[n], expected[n], rtol=1e-5, atol=1e-6, err_msg=f"{n} at step {step}")
    group.shutdown()


@pytest.mark.parametrize("average, expected", [(False, 0.5), (True, 0.25)])
def test_async_average_scales_each_push_by_the_worker_count(ray_session, average, expected):
    """Downpour with async_average: 2 workers' pushes each move the parameters half as far, so a
    round of pushes moves them as far as one sync step of the averaged gradient."""
    from orchard.strategies.ps import PSClient, PSGroup

    group = PSGroup.create({"w": np.ones(3, np.float32)}, num_workers=2, mode="async",
                           optimizer={"name": "sgd", "lr": 0.5}, async_average=average)
    fresh = PSClient(group, 0).push_pull({"w": np.ones(3, np.float32)}, step=0)
    np.testing.assert_allclose(fresh["w"], 1.0 - expected)
    group.shutdown()


def test_a_group_started_smaller_resizes_the_sync_barrier(ray_session):
    """A worker group restarted with fewer workers (elastic, after a lost node) tells the servers
    its size first: one worker's push then completes the step instead of waiting for a worker
    that is gone, and the unfinished step of the group before is dropped."""
    from orchard.strategies.ps import PSClient, PSGroup

    group = PSGroup.create({"w": np.ones(3, np.float32)}, num_workers=2, mode="sync",
                           optimizer={"name": "sgd", "lr": 0.5})
    group.servers[0].push_pull.remote(None, 1, 7, False, 1, np.ones(3, np.float32))  # half of step 7, then its pusher is lost
    # An async actor need not run calls in the order they were sent: wait until the server
    # holds the half step, or begin(1) could come first and let that push complete step 7.
    deadline = time.monotonic() + 60
    while ray_session.get(group.servers[0].stats.remote())["bytes_in"] == 0:
        assert time.monotonic() < deadline, "the half step never reached the server"
        time.sleep(0.05)
    group.begin(1)
    fresh = PSClient(group, 0).push_pull({"w": np.ones(3, np.float32)}, step=0)
    np.testing.assert_allclose(fresh["w"], 0.5)  # one worker's gradient, applied once
    group.shutdown()


def test_a_shard_bigger_than_a_piece_crosses_in_pieces_and_arrives_whole(ray_session):
    """Shards up to INLINE_MAX_BYTES cross in pieces Ray carries inside the call (wire_pieces);
    the server joins them, and its answer, cut the same way, is joined again: full and sampled
    pushes give what one array would, and a shard above the cap travels whole."""
    from orchard.strategies.ps import INLINE_MAX_BYTES, INLINE_PIECE_BYTES, PSClient, PSGroup, wire_pieces

    assert wire_pieces(10) == 1 and wire_pieces(INLINE_PIECE_BYTES // 4 + 1) == 2
    assert wire_pieces(INLINE_MAX_BYTES // 4) > 1 and wire_pieces(INLINE_MAX_BYTES // 4 + 1) == 1
    rng = np.random.default_rng(2)
    params = {"big": rng.normal(size=(300, 251)).astype(np.float32), "small": rng.normal(size=7).astype(np.float32),
              "mid": rng.normal(size=40_001).astype(np.float32)}
    spec = {"name": "sgd", "lr": 0.1}
    group = PSGroup.create(params, num_servers=1, num_workers=1, mode="async", optimizer=spec)
    assert wire_pieces(sum(v.size for v in params.values())) > 3
    client, reference, expected = PSClient(group, 0), NumpyOptimizer(spec), dict(params)
    for step, names in enumerate([list(params), ["mid", "small"]]):
        grads = {n: rng.normal(size=params[n].shape).astype(np.float32) for n in names}
        fresh = client.push_pull(grads, step, only_pushed=step == 1)
        expected = reference.apply(expected, grads)
        assert set(fresh) == set(names)
        for n in fresh:
            np.testing.assert_allclose(fresh[n], expected[n], rtol=1e-5, atol=1e-6, err_msg=f"{n} at step {step}")
    group.shutdown()


def test_servers_shut_down_while_one_restarts_free_every_cpu(ray_session):
    """A server SIGKILLed comes back (``max_restarts``); shut down meanwhile, every server is gone
    and its CPUs free (kill_and_confirm: Ray can ignore a kill that reaches one mid-restart)."""
    import os
    import signal

    from orchard.strategies.ps import PSGroup
    from tests.session_ray import all_cpus_free

    ray = ray_session
    params = {"a": np.ones(4, np.float32), "b": np.ones(2, np.float32)}  # a shard each
    group = PSGroup.create(params, num_servers=2, num_workers=1, mode="async", cpus_per_server=0.5)
    pid = ray.get(group.servers[0].__ray_call__.remote(lambda server: os.getpid()))
    os.kill(pid, signal.SIGKILL)
    group.shutdown()
    for server in group.servers:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(server.__ray_ready__.remote(), timeout=30)
    assert all_cpus_free(), ray.available_resources()
