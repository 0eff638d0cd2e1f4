"""Partitioning inside a worker group (5.2, Appendix B): inserted slice/concat/split/bridge
layers must leave the net's outputs and gradients unchanged, in one process and with the
group's nodes as separate Ray actors whose bridges really send."""
from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from workloads.singa.group_nodes import NodeGroup
from workloads.singa.model import NeuralNet
from workloads.singa.partition import partition_net, PartitionedNet, plan_partition
from workloads.singa.settings import load_app

SMALL_CNN = [
    {"name": "data", "type": "data"},
    {"name": "label", "type": "label", "srclayers": "data"},
    {"name": "rgb", "type": "rgb_image", "srclayers": "data", "field": "image", "norm_a": 255.0},
    {"name": "conv1", "type": "convolution", "srclayers": "rgb", "num_filters": 6, "kernel": 3, "pad": 1,
     "weight": {"init": "xavier"}},
    {"name": "relu1", "type": "relu", "srclayers": "conv1"},
    {"name": "pool1", "type": "pooling", "srclayers": "relu1", "pool": "max", "kernel": 3, "stride": 2},
    {"name": "norm1", "type": "lrn", "srclayers": "pool1", "local_size": 3, "alpha": 0.01},
    {"name": "ip1", "type": "innerproduct", "srclayers": "norm1", "num_output": 10},
    {"name": "loss", "type": "softmax_loss", "srclayers": ["ip1", "label"]},
]
CNN_SHAPES = {"image": (3, 12, 12), "label": ()}


def cnn_batch(n=10):
    g = torch.Generator().manual_seed(0)
    return {"image": torch.randint(0, 256, (n, 3, 12, 12), generator=g, dtype=torch.uint8),
            "label": torch.randint(0, 10, (n,), generator=g)}


def mlp_case():
    app = load_app("mlp")
    g = torch.Generator().manual_seed(1)
    batch = {"pixel": torch.randint(0, 256, (9, 64), generator=g, dtype=torch.uint8),
             "label": torch.randint(0, 10, (9,), generator=g)}
    return app["layers"], {"pixel": (64,), "label": ()}, batch


@pytest.mark.parametrize("case,group_size", [("mlp", 3), ("cnn", 2), ("cnn", 3)])
@pytest.mark.parametrize("scheme", ["data", "model", "hybrid"])
def test_partitioned_net_equals_unpartitioned(case, scheme, group_size):
    layers, shapes, batch = mlp_case() if case == "mlp" else (SMALL_CNN, CNN_SHAPES, cnn_batch())
    whole = NeuralNet(layers, shapes, seed=0)
    ref_metrics = whole.train_bp(batch)
    ref_grads, ref_params = whole.get_grads(), whole.get_params()
    split = partition_net(NeuralNet(layers, shapes, seed=0), group_size, scheme, len(batch["label"]))
    assert isinstance(split, PartitionedNet)
    types = {layer.type for layer in split.layers}
    assert {"bridge_src", "bridge_dst"} <= types and ({"slice", "concat"} & types)
    assert max(layer.location for layer in split.layers) == group_size - 1
    metrics = split.train_bp(batch)
    assert metrics["loss/loss"] == pytest.approx(ref_metrics["loss/loss"], rel=1e-5)
    grads = split.get_grads()
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)
    for name, value in split.get_params().items():
        np.testing.assert_array_equal(value, ref_params[name])
    assert split.bridge_bytes() > 0


def test_set_params_round_trips_through_the_pieces():
    layers, shapes, _ = mlp_case()
    split = partition_net(NeuralNet(layers, shapes, seed=0), 2, "model", 8)
    new = {k: np.random.default_rng(0).standard_normal(v.shape).astype(np.float32)
           for k, v in split.get_params().items()}
    split.set_params(new)
    for k, v in split.get_params().items():
        np.testing.assert_array_equal(v, new[k])


def test_hybrid_plan_is_data_for_convolutions_and_model_for_a_big_inner_product():
    """Appendix B: data partitioning for the convolutional layers (big features, few params),
    model partitioning for the inner-product layer with many params and a small feature."""
    layers = [dict(c) for c in SMALL_CNN]
    layers[7] = dict(layers[7], num_output=2048)  # a big fully connected layer
    layers.insert(8, {"name": "ip2", "type": "innerproduct", "srclayers": "ip1", "num_output": 10})
    layers[-1] = dict(layers[-1], srclayers=["ip2", "label"])
    net = NeuralNet(layers, CNN_SHAPES, seed=0)
    plan = plan_partition(net, 2, "hybrid", batch_size=100)
    dims = {k: v["dim"] for k, v in plan.items()}
    assert dims["conv1"] == 0 and dims["pool1"] == 0 and dims["norm1"] == 0
    assert dims["ip1"] == 1
    assert dims["data"] is None and dims["loss"] is None
    assert plan["ip1"]["costs"][1] < plan["ip1"]["costs"][0]


def test_explicit_partition_dim_wins_and_is_checked():
    layers = [dict(c) for c in SMALL_CNN]
    layers[3] = dict(layers[3], partition_dim=1)
    plan = plan_partition(NeuralNet(layers, CNN_SHAPES, seed=0), 2, "data", 10)
    assert plan["conv1"]["dim"] == 1 and plan["relu1"]["dim"] == 0
    layers[6] = dict(layers[6], partition_dim=1)  # LRN needs neighbouring channels
    with pytest.raises(ValueError, match="norm1"):
        plan_partition(NeuralNet(layers, CNN_SHAPES, seed=0), 2, "data", 10)


def test_data_partitioning_sends_only_the_input_slice_and_the_scores():
    """Data partitioning of the mlp over 2 nodes: node 1 gets its 4 of 9 rows of pixels (no
    gradient goes back into the input) and returns its 4 rows of scores to the loss on node 0,
    which sends their gradient back.  Nothing else crosses: the hidden layers stay on their node."""
    layers, shapes, batch = mlp_case()
    split = partition_net(NeuralNet(layers, shapes, seed=0), 2, "data", 9)
    split.train_bp(batch)
    assert split.bridge_bytes() == 4 * 64 * 4 + 2 * (4 * 10 * 4)


@pytest.mark.slow
@pytest.mark.parametrize("case,group_size,scheme", [("mlp", 3, "hybrid"), ("cnn", 2, "model")])
def test_node_actors_send_through_bridges_and_match_the_unpartitioned_net(ray_session, case, group_size, scheme):
    """Each node of the group is its own Ray actor running only its layers; features and
    gradients cross only through the bridge pairs.  Outputs and gradients equal the whole net's,
    and the bytes the bridges actually sent equal what the one-process version counts."""
    layers, shapes, batch = mlp_case() if case == "mlp" else (SMALL_CNN, CNN_SHAPES, cnn_batch())
    size = len(batch["label"])
    whole = NeuralNet(layers, shapes, seed=0)
    ref_metrics = whole.train_bp(batch)
    ref_grads = whole.get_grads()
    in_process = partition_net(NeuralNet(layers, shapes, seed=0), group_size, scheme, size)
    in_process.train_bp(batch)
    master = partition_net(NeuralNet(layers, shapes, seed=0), group_size, scheme, size)
    recipe = {"layers": layers, "input_shapes": shapes, "seed": 0, "group_size": group_size, "plan": master.plan}
    nodes = NodeGroup(master, recipe)
    try:
        metrics = nodes.run("bp", batch)
        test_metrics = nodes.run("test", batch)
        pids = ray.get([n.pid.remote() for n in nodes.nodes])
    finally:
        nodes.close()
    assert len(set(pids)) == group_size  # one process per node
    assert metrics["loss/loss"] == pytest.approx(ref_metrics["loss/loss"], rel=1e-5)
    assert test_metrics["loss/accuracy"] == pytest.approx(ref_metrics["loss/accuracy"])
    grads = master.get_grads()
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert nodes.bridge_bytes == in_process.bridge_bytes() > 0
    assert nodes.param_bytes >= 2 * sum(v.nbytes for v in ref_grads.values())


@pytest.mark.slow
def test_cd_through_node_actors_sends_only_features(ray_session):
    """The DBN's second CD stage with its frozen lower layer (h1) data-partitioned over 2 node
    actors: the RBM pair stays whole on node 0, and CD sends no gradients, only node 1's input
    rows (4 x 64 floats) and its h1 rows (4 x 256) back to the RBM."""
    layers = load_app("dbn")["pretrain"][1]["layers"]
    shapes = {"pixel": (64,), "label": ()}
    batch = {"pixel": torch.randint(0, 17, (9, 64), generator=torch.Generator().manual_seed(1)).to(torch.uint8)}
    master = partition_net(NeuralNet(layers, shapes, seed=0), 2, "data", 9)
    assert master.describe_plan()["h1"] == "data" and master.describe_plan()["v2"] == "whole"
    nodes = NodeGroup(master, {"layers": layers, "input_shapes": shapes, "seed": 0, "group_size": 2,
                               "plan": master.plan})
    try:
        metrics = nodes.run("cd", batch)
    finally:
        nodes.close()
    assert 0 < metrics["v2/recon_error"] < 1
    assert np.abs(master.get_grads()["h2/weight"]).sum() > 0  # the RBM weights got a CD gradient
    assert nodes.bridge_bytes == 4 * 64 * 4 + 4 * 256 * 4
