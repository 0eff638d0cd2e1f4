"""Training architectures (5.1) on real Ray actors with orchard's parameter servers."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.singa.architectures import Architecture, sample_names
from workloads.singa.worker_group import WorkerGroup

# wd_mult 0 on fc1's bias and 3 on fc2's weight: the servers must decay per parameter as the
# local updater does (their own decay would treat every parameter alike).
LAYERS = [
    {"name": "data", "type": "data"},
    {"name": "label", "type": "label", "srclayers": "data"},
    {"name": "mnist", "type": "mnist", "srclayers": "data", "field": "pixel", "norm_a": 127.5, "norm_b": 1.0},
    {"name": "fc1", "type": "tanh_hidden", "srclayers": "mnist", "num_output": 48, "bias": {"wd_mult": 0.0}},
    {"name": "fc2", "type": "innerproduct", "srclayers": "fc1", "num_output": 10, "weight": {"wd_mult": 3.0}},
    {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2", "label"]},
]


def spec(batch_size: int, **extra) -> dict:
    return {"layers": LAYERS, "algorithm": "bp", "data": "digits", "data_dir": None, "seed": 0, "smoke": True,
            "batch_size": batch_size, "shuffle": False, "augment": None, "group_size": 1, "partition": "none",
            "threads": 1, "updater": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
            **extra}


def arch(name: str, groups: int, **extra) -> dict:
    return {"name": name, "worker_groups": groups, "workers_per_group": 1, "server_groups": 1,
            "servers_per_group": 2, "mode": "sync", "sync_every": 1, "sample_ratio": 1.0, **extra}


def run(architecture: Architecture, steps: int) -> dict:
    try:
        architecture.run_steps(steps)
        return architecture.params()
    finally:
        architecture.shutdown()


@pytest.mark.slow
def test_sync_ps_with_two_groups_equals_one_group_with_the_doubled_batch(ray_session):
    # shuffle=False: group r of 2 reads rows r, r+2, ... so two batches of 20 are exactly the
    # 40 rows that one group reads; averaged gradients then equal the big batch's gradient.
    single = Architecture(arch("local", 1), spec(40), 1)
    initial = single.params()
    one = run(single, steps=6)
    two = run(Architecture(arch("sync_ps", 2), spec(20), 0.5), steps=6)
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert any(not np.allclose(initial[n], one[n]) for n in one)  # training moved the parameters


@pytest.mark.slow
def test_sync_every_pushes_accumulated_gradients_every_n_steps(ray_session):
    # Pushing the sum of 2 steps' gradients (batch 20, at the same parameters) every 2 steps is
    # one step of batch 40 at twice the rate: same parameters, half the messages.
    every2 = Architecture(arch("sync_ps", 2, sync_every=2), spec(20, push_every=2), 0.5)
    every2.run_steps(4)
    stats2 = every2.stats()
    two = run(every2, 0)
    doubled = dict(spec(40), updater={"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01})
    every1 = Architecture(arch("sync_ps", 2), doubled, 0.5)
    every1.run_steps(2)
    stats1 = every1.stats()
    one = run(every1, 0)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert stats2["pushes"] == 2 and stats2["steps"] == 4 and stats1["pushes"] == 2
    assert stats2["comm_bytes_per_step"] == pytest.approx(stats1["comm_bytes_per_step"] / 2)


def test_parameter_sampling_is_random_and_seeded():
    names = [f"layer{i}/weight" for i in range(10)]
    draws = [sample_names(names, 0.3, seed=0, group=0, push=p) for p in range(20)]
    assert all(len(d) == 3 for d in draws) and len({tuple(d) for d in draws}) > 10   # not a rotating window
    assert set().union(*map(set, draws)) == set(names)
    assert draws[5] == sample_names(names, 0.3, seed=0, group=0, push=5)              # reproducible
    assert draws[5] != sample_names(names, 0.3, seed=1, group=0, push=5) or \
        draws[6] != sample_names(names, 0.3, seed=1, group=0, push=6)                  # the seed matters
    assert sample_names(names, 1.0, 0, 0, 0) == names


@pytest.mark.slow
@pytest.mark.parametrize("name,extra", [
    ("async_ps", {"mode": "async", "sample_ratio": 0.5}),
    ("replicated", {"server_groups": 2, "servers_per_group": 1, "sync_every": 5}),
    ("allreduce", {"server_groups": 0, "servers_per_group": 0}),
])
def test_every_architecture_trains_and_counts_its_traffic(ray_session, name, extra):
    machine = Architecture(arch(name, 2, **extra), spec(32, shuffle=True), 0.5)
    try:
        before = machine.evaluate()["loss/accuracy"]
        machine.run_steps(2 * machine.steps_per_epoch)
        after = machine.evaluate()["loss/accuracy"]
        stats = machine.stats()
        params = machine.params()
    finally:
        machine.shutdown()
    assert after > max(0.6, before + 0.3)
    assert stats["comm_bytes_per_step"] > 0
    num_bytes = sum(v.nbytes for v in params.values())
    if name == "async_ps":
        # sampling sends 2 of the 4 tensors per push, a random pair each time, and the servers
        # answer only those: well under the full exchange of 2 groups x (up + down)
        assert stats["comm_bytes_per_step"] < 2 * 2 * num_bytes
        pushed = stats["pushed_names"]
        assert all(len(p) == 2 for p in pushed) and len({tuple(p) for p in pushed}) > 1
    if name == "allreduce":
        assert stats["comm_bytes_per_step"] == pytest.approx(2 * num_bytes, rel=0.01)


@pytest.mark.slow
def test_partitioned_group_trains_like_the_whole_model(ray_session):
    # The group's 2 nodes are Ray actors; the group's updater works on unpartitioned names, so
    # data replicas inside the group stay identical and training follows the whole model.
    whole, split = WorkerGroup(spec(30)), WorkerGroup(spec(30, group_size=2, partition="hybrid"))
    try:
        assert split.partitioned and split.plan()["fc1"] in ("data", "model")
        for _ in range(3):
            whole.local_step()
            split.local_step()
        assert split.evaluate()["loss/accuracy"] == pytest.approx(whole.evaluate()["loss/accuracy"])
        stats = split.stats()
    finally:
        split.close()
    assert stats["bridge_bytes"] > 0 and stats["group_param_bytes"] > 0
    whole, split = whole.get_params(), split.get_params()
    for name in whole:
        np.testing.assert_allclose(split[name], whole[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.slow
def test_async_average_scales_each_push_by_the_number_of_groups(ray_session):
    # One push per group, both computed at the starting parameters: plain SGD on the servers
    # moves the parameters by the sum of the two steps, or by half of it with async_average.
    moved = {}
    for average in (False, True):
        machine = Architecture(arch("async_ps", 2, mode="async", async_average=average),
                               spec(20, updater={"name": "sgd", "lr": 0.05}), 0.5)
        start = machine.params()
        end = run(machine, 1)
        moved[average] = {n: end[n] - start[n] for n in end}
    for n in moved[True]:
        assert np.abs(moved[False][n]).max() > 0
        np.testing.assert_allclose(moved[True][n], 0.5 * moved[False][n], rtol=1e-4, atol=1e-7, err_msg=n)
