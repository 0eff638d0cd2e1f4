"""Nets from YAML (Fig. 3), user layer types, BP, CD-k and the updaters."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import yaml

from workloads.singa.layers import AutogradLayer, layer_class, register_layer
from workloads.singa.model import NeuralNet, topological_order
from workloads.singa.settings import load_app
from workloads.singa.updaters import Updater

FIG3 = """
- {name: data, type: data}
- {name: label, type: label, srclayers: data}
- {name: pixels, type: mnist, srclayers: data, field: pixel, norm_a: 1.0}
- {name: hidden, type: hidden, srclayers: pixels, num_output: 3}
- {name: softmax, type: softmax_loss, srclayers: [hidden, label]}
"""
SHAPES = {"pixel": (5,), "label": ()}


def batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"pixel": torch.rand(n, 5, generator=g), "label": torch.randint(0, 3, (n,), generator=g)}


def test_fig3_net_from_yaml_equals_the_same_net_built_in_code():
    torch.manual_seed(0)
    net = NeuralNet(yaml.safe_load(FIG3), SHAPES, seed=1)
    # the same net wired by hand through the layer contract
    torch.manual_seed(1)
    data = layer_class("data")("data", {})
    data.setup([], {"input_shapes": SHAPES})
    label = layer_class("label")("label", {})
    label.setup([data], {})
    pixels = layer_class("mnist")("pixels", {"field": "pixel", "norm_a": 1.0})
    pixels.setup([data], pixels.conf)
    hidden = layer_class("hidden")("hidden", {"num_output": 3})
    hidden.setup([pixels], hidden.conf)
    loss = layer_class("softmax_loss")("softmax", {})
    loss.setup([hidden, label], {})
    b = batch()
    data.records = b
    for layer in (data, label, pixels, hidden, loss):
        layer.compute_feature(layer.src_layers)
    for layer in (loss, hidden):
        layer.compute_gradient(layer.src_layers)
    metrics = net.train_bp(b)
    assert metrics["softmax/loss"] == pytest.approx(loss.metrics["loss"])
    torch.testing.assert_close(net.by_name["hidden"].weight.grad, hidden.weight.grad)
    torch.testing.assert_close(net.by_name["hidden"].bias.grad, hidden.bias.grad)
    # Fig. 3's HiddenLayer gradient, written out: dW = x^T (g * f (1 - f))
    f = net.by_name["hidden"].data.feature
    g = net.by_name["hidden"].data.grad
    torch.testing.assert_close(hidden.weight.grad, b["pixel"].t() @ (g * f * (1 - f)))


def test_layers_are_ordered_whatever_the_file_order():
    confs = yaml.safe_load(FIG3)
    random.Random(3).shuffle(confs)
    names = [c["name"] for c in topological_order(confs)]
    assert names.index("data") < names.index("pixels") < names.index("hidden") < names.index("softmax")
    with pytest.raises(ValueError, match="unknown src layer"):
        topological_order([{"name": "a", "type": "relu", "srclayers": "nowhere"}])


@register_layer("test_scaled_tanh")
class ScaledTanh(AutogradLayer):
    """A user layer written only as a forward: y = a * tanh(x) with a learned per-unit a."""

    partition_dims = (0,)

    def setup(self, src_layers, conf):
        super().setup(src_layers, conf)
        self.scale = self.param("scale", self.shape, "scale", {"init": "constant", "value": 1.5})

    def forward(self, x):
        return self.scale.val * torch.tanh(x)


def test_custom_layer_registered_from_a_test_trains_in_a_yaml_net():
    confs = yaml.safe_load(FIG3)
    confs.insert(4, {"name": "squash", "type": "test_scaled_tanh", "srclayers": "hidden"})
    confs[-1]["srclayers"] = ["squash", "label"]
    net = NeuralNet(confs, SHAPES, seed=0)
    b = batch(16)
    first = net.train_bp(b)["softmax/loss"]
    assert net.by_name["squash"].scale.grad.abs().sum() > 0
    # its gradient w.r.t. the hidden layer is autograd's: d(a tanh h)/dh = a (1 - tanh^2 h)
    h = net.by_name["hidden"].data.feature
    expected = net.by_name["squash"].data.grad * 1.5 * (1 - torch.tanh(h) ** 2)
    f = net.by_name["hidden"].data.feature
    torch.testing.assert_close(net.by_name["hidden"].weight.grad, b["pixel"].t() @ (expected * f * (1 - f)))
    updater = Updater({"name": "sgd", "lr": 0.5})
    for step in range(30):
        net.train_bp(b)
        updater.update(net.params, step)
    assert net.forward(b, "test")["softmax/loss"] < first


def test_cd_lowers_reconstruction_error_of_a_tiny_rbm():
    rng = np.random.default_rng(0)
    prototypes = (rng.random((3, 12)) > 0.5).astype(np.float32)
    data = prototypes[rng.integers(0, 3, 300)]
    flips = rng.random(data.shape) < 0.05
    data = np.abs(data - flips).astype(np.float32)
    confs = [{"name": "data", "type": "data"},
             {"name": "v", "type": "rbm_visible", "srclayers": ["input", "h"]},
             {"name": "input", "type": "feature", "srclayers": "data", "field": "x"},
             {"name": "h", "type": "rbm_hidden", "srclayers": "v", "num_output": 6}]
    net = NeuralNet(confs, {"x": (12,)}, seed=0)
    assert [layer.name for layer in net.layers] == ["data", "input", "v", "h"]
    updater = Updater({"name": "sgd", "lr": 0.3, "momentum": 0.5})
    x = torch.from_numpy(data)
    before = net.train_cd({"x": x}, k=1)["v/recon_error"]
    for step in range(400):
        idx = torch.randint(0, len(x), (30,))
        net.train_cd({"x": x[idx]}, k=1)
        updater.update(net.params, step)
    after = np.mean([net.train_cd({"x": x}, k=1)["v/recon_error"] for _ in range(5)])
    assert after < 0.5 * before
    # held out: a test pass reports this batch's reconstruction error (mean field), not the
    # last training batch's
    held_out = torch.from_numpy(np.abs(prototypes[rng.integers(0, 3, 50)] - (rng.random((50, 12)) < 0.05))
                                .astype(np.float32))
    W, b_h, b_v = net.by_name["h"].weight.val, net.by_name["h"].bias.val, net.by_name["v"].bias.val
    expected = ((held_out - torch.sigmoid(torch.sigmoid(held_out @ W + b_h) @ W.t() + b_v)) ** 2).sum(1).mean()
    assert net.forward({"x": held_out}, "test")["v/recon_error"] == pytest.approx(float(expected), rel=1e-5)
    noise = torch.bernoulli(torch.full((50, 12), 0.5))
    assert net.forward({"x": noise}, "test")["v/recon_error"] > 2 * float(expected)


@pytest.mark.parametrize("name,torch_opt", [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("adagrad", lambda p: torch.optim.Adagrad(p, lr=0.1, weight_decay=0.01, eps=1e-8)),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.01)),
])
def test_updaters_follow_the_torch_rules(name, torch_opt):
    net = NeuralNet(yaml.safe_load(FIG3), SHAPES, seed=0)
    ref = [torch.nn.Parameter(p.val.clone()) for p in net.params]
    opt = torch_opt(ref)
    updater = Updater({"name": name, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "eps": 1e-8})
    for step in range(5):
        net.train_bp(batch(seed=step))
        for r, p in zip(ref, net.params):
            r.grad = p.grad.clone()
        opt.step()
        updater.update(net.params, step)
    for r, p in zip(ref, net.params):
        torch.testing.assert_close(p.val, r.detach(), rtol=1e-5, atol=1e-6)


def test_lr_mult_and_step_policy():
    net = NeuralNet(yaml.safe_load(FIG3.replace("num_output: 3}", "num_output: 3, bias: {lr_mult: 0.0}}")),
                    SHAPES, seed=0)
    bias_before = net.by_name["hidden"].bias.val.clone()
    updater = Updater({"name": "sgd", "lr": 0.1, "lr_policy": "step", "step_size": 2, "gamma": 0.1})
    net.train_bp(batch())
    updater.update(net.params, 0)
    assert torch.equal(net.by_name["hidden"].bias.val, bias_before)
    from workloads.singa.updaters import learning_rate

    assert [round(learning_rate(updater.conf, s), 6) for s in (0, 1, 2, 4)] == [0.1, 0.1, 0.01, 0.001]


@pytest.mark.parametrize("app", ["mlp", "cnn", "rbm", "dbn", "msae"])
def test_every_app_net_builds_from_its_yaml(app):
    conf = load_app(app)
    shapes = {"mlp": {"pixel": (64,), "label": ()}, "cnn": {"image": (3, 32, 32), "label": ()},
              "rbm": {"pixel": (64,), "label": ()}, "dbn": {"pixel": (64,), "label": ()},
              "msae": {"image": (64,), "text": (47,), "label": ()}}[app]
    net = NeuralNet(conf["layers"], shapes, seed=0)
    assert net.layers[0].type == "data" and any(layer.is_loss for layer in net.layers)
    for stage in conf.get("pretrain", []):
        assert NeuralNet(stage["layers"], shapes, seed=0).rbm_layers()
    if app == "cnn":
        # section 6.5.1: "the number of parameters of the DCNN model ... (85,000 in total)"
        assert 80_000 < sum(p.size for p in net.params) < 95_000
