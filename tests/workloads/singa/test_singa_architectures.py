"""Training architectures (5.1) on real Ray actors with orchard's parameter servers."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.singa.architectures import Architecture
from workloads.singa.worker_group import WorkerGroup

LAYERS = [
    {"name": "data", "type": "data"},
    {"name": "label", "type": "label", "srclayers": "data"},
    {"name": "mnist", "type": "mnist", "srclayers": "data", "field": "pixel", "norm_a": 127.5, "norm_b": 1.0},
    {"name": "fc1", "type": "tanh_hidden", "srclayers": "mnist", "num_output": 48},
    {"name": "fc2", "type": "innerproduct", "srclayers": "fc1", "num_output": 10},
    {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2", "label"]},
]


def spec(batch_size: int, **extra) -> dict:
    return {"layers": LAYERS, "algorithm": "bp", "data": "digits", "data_dir": None, "seed": 0, "smoke": True,
            "batch_size": batch_size, "shuffle": False, "augment": None, "group_size": 1, "partition": "none",
            "threads": 1, "updater": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4},
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
        # sampling sends about half of the gradients, but the servers still answer full shards
        assert stats["comm_bytes_per_step"] < 2 * 2 * num_bytes
    if name == "allreduce":
        assert stats["comm_bytes_per_step"] == pytest.approx(2 * num_bytes, rel=0.01)


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
