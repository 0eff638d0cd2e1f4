"""Every built-in layer's explicit gradients against torch.autograd of its own forward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workloads.singa.layers import Layer, layer_class


class Source(Layer):
    """A test source: holds a fixed tensor as its feature; receives gradients."""

    def __init__(self, value: torch.Tensor, name="src"):
        super().__init__(name, {})
        self.value = value
        self.shape = tuple(value.shape[1:])
        self.data.feature = value

    def compute_feature(self, src_layers, phase="train"):
        self.data.feature = self.value


def build(type_name: str, conf: dict, sources: list[Layer]) -> Layer:
    layer = layer_class(type_name)("layer", conf)
    layer.setup(sources, conf)
    for p in layer.params:
        p.val = p.val.double()
        p.grad = torch.zeros_like(p.val)
    return layer


def explicit_vs_autograd(layer: Layer, sources: list[Source], seed: int = 0, phase: str = "train"):
    """Gradients from compute_gradient vs torch.autograd through compute_feature."""
    grad_sources = [s for s in sources if s.value.is_floating_point()]
    for s in grad_sources:
        s.data.feature = s.value.clone().requires_grad_(True)
    for p in layer.params:
        p.val.requires_grad_(True)
    torch.manual_seed(seed)
    with torch.enable_grad():
        layer.compute_feature(sources, phase)
        out = layer.data.feature
        upstream = torch.randn_like(out)
        wrt = [s.data.feature for s in grad_sources] + [p.val for p in layer.params]
        ref = torch.autograd.grad(out, wrt, upstream, allow_unused=True)
    for p in layer.params:
        p.val.requires_grad_(False)
    for s in sources:
        s.data.feature = s.value
        s.data.grad = None
    torch.manual_seed(seed)
    layer.compute_feature(sources, phase)
    layer.data.grad = upstream
    layer.compute_gradient(sources)
    got = [s.data.grad for s in grad_sources] + [p.grad for p in layer.params]
    for name, g, r in zip([s.name for s in grad_sources] + [p.name for p in layer.params], got, ref):
        r = torch.zeros_like(g) if r is None else r
        assert g is not None, f"{name}: no gradient"
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-8, msg=f"{layer.type}: gradient of {name}")


def x(*shape):
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("type_name,conf", [
    ("innerproduct", {"num_output": 5}),
    ("hidden", {"num_output": 5}),
    ("tanh_hidden", {"num_output": 5}),
    ("hidden", {"num_output": 5, "activation": "relu"}),
])
def test_fully_connected_gradients(type_name, conf):
    src = Source(x(4, 7))
    layer = build(type_name, conf, [src])
    for p in layer.params:  # non-zero bias so the activation derivative is exercised everywhere
        p.val.normal_()
    explicit_vs_autograd(layer, [src])


def test_inner_product_flattens_image_features():
    src = Source(x(3, 2, 4, 4))
    layer = build("innerproduct", {"num_output": 6}, [src])
    explicit_vs_autograd(layer, [src])
    assert src.data.grad.shape == (3, 2, 4, 4)


@pytest.mark.parametrize("type_name", ["tanh", "sigmoid", "relu"])
def test_elementwise_gradients(type_name):
    src = Source(x(4, 9))
    explicit_vs_autograd(build(type_name, {}, [src]), [src])


def test_dropout_gradient_uses_the_same_mask_and_is_identity_at_test():
    src = Source(x(8, 20))
    layer = build("dropout", {"dropout_ratio": 0.4}, [src])
    explicit_vs_autograd(layer, [src], seed=3)
    layer.compute_feature([src], "test")
    assert torch.equal(layer.data.feature, src.value)


@pytest.mark.parametrize("conf", [
    {"num_filters": 4, "kernel": 3, "pad": 1},
    {"num_filters": 3, "kernel": 5, "pad": 2, "stride": 2},
])
def test_convolution_gradients(conf):
    src = Source(x(2, 3, 8, 8))
    layer = build("convolution", conf, [src])
    explicit_vs_autograd(layer, [src])
    assert layer.data.feature.shape[1:] == layer.shape


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pooling_gradients_and_ceil_shape(pool):
    src = Source(x(2, 3, 32, 32))
    layer = build("pooling", {"pool": pool, "kernel": 3, "stride": 2}, [src])
    explicit_vs_autograd(layer, [src])
    assert layer.shape == (3, 16, 16) == tuple(layer.data.feature.shape[1:])  # cuda-convnet's 32 -> 16


@pytest.mark.parametrize("size", [3, 5])
def test_lrn_gradients(size):
    src = Source(x(2, 7, 4, 4) * 3)
    layer = build("lrn", {"local_size": size, "alpha": 0.1, "beta": 0.75}, [src])
    explicit_vs_autograd(layer, [src])


def test_lrn_matches_torch_local_response_norm():
    src = Source(x(2, 6, 5, 5))
    layer = build("lrn", {"local_size": 3, "alpha": 1e-2, "beta": 0.75, "knorm": 1.0}, [src])
    src.compute_feature([])
    layer.compute_feature([src])
    torch.testing.assert_close(layer.data.feature, F.local_response_norm(src.value, 3, 1e-2, 0.75, 1.0))


def test_softmax_loss_gradient_and_accuracy():
    scores = Source(x(6, 4), "scores")
    labels = Source(torch.tensor([0, 1, 2, 3, 0, 1]), "labels")
    layer = build("softmax_loss", {"loss_weight": 0.5}, [scores, labels])
    s = scores.value.clone().requires_grad_(True)
    ref_loss = 0.5 * F.cross_entropy(s, labels.value)
    ref_grad, = torch.autograd.grad(ref_loss, s)
    layer.compute_feature([scores, labels])
    layer.compute_gradient([scores, labels])
    torch.testing.assert_close(scores.data.grad, ref_grad)
    assert layer.metrics["loss"] == pytest.approx(float(ref_loss.detach()))
    assert layer.metrics["accuracy"] == pytest.approx(float((scores.value.argmax(1) == labels.value).double().mean()))


def test_euclidean_loss_gradient_reaches_both_sources():
    a, b = Source(x(5, 3), "a"), Source(x(5, 3), "b")
    layer = build("euclidean_loss", {"loss_weight": 2.0}, [a, b])
    ta, tb = a.value.clone().requires_grad_(True), b.value.clone().requires_grad_(True)
    ref = 2.0 * 0.5 * (ta - tb).pow(2).sum(1).mean()
    ga, gb = torch.autograd.grad(ref, [ta, tb])
    layer.compute_feature([a, b])
    layer.compute_gradient([a, b])
    torch.testing.assert_close(a.data.grad, ga)
    torch.testing.assert_close(b.data.grad, gb)
    assert layer.metrics["loss"] == pytest.approx(float(ref.detach()))


def test_rbm_cd_gradients_equal_free_energy_gradients():
    """CD's update is the gradient of F(v0) - F(vk) with vk held fixed (Hinton 2002), where
    F(v) = -v.b_v - sum softplus(v W + b_h): autograd of that must equal the explicit one."""
    torch.manual_seed(0)
    v0 = Source(torch.rand(8, 6, dtype=torch.float64).round(), "input")
    vis = layer_class("rbm_visible")("v", {})
    hid = layer_class("rbm_hidden")("h", {"num_output": 4})
    vis.setup([v0, hid], {})
    hid.setup([vis], {"num_output": 4})
    for p in vis.params + hid.params:
        p.val = torch.randn_like(p.val).double() * 0.5
    v0.compute_feature([])
    vis.compute_feature([v0, hid], "positive")
    hid.compute_feature([vis], "positive")
    vis.compute_feature([v0, hid], "negative")
    hid.compute_feature([vis], "negative")
    hid.compute_gradient([vis])
    vis.compute_gradient([v0, hid])
    w, bh, bv = (t.clone().requires_grad_(True) for t in (hid.weight.val, hid.bias.val, vis.bias.val))

    def free_energy(v):
        return (-(v @ bv) - F.softplus(v @ w + bh).sum(1)).mean()

    ref = torch.autograd.grad(free_energy(vis.pos) - free_energy(vis.neg), [w, bh, bv])
    torch.testing.assert_close(hid.weight.grad, ref[0])
    torch.testing.assert_close(hid.bias.grad, ref[1])
    torch.testing.assert_close(vis.bias.grad, ref[2])


@pytest.mark.parametrize("dim", [0, 1])
def test_slice_and_concat_gradients(dim):
    src = Source(x(6, 5))
    pieces = [build("slice", {"dim": dim, "num_slices": 3, "index": i}, [src]) for i in range(3)]
    for piece in pieces:
        explicit_vs_autograd(piece, [src])
    parts = [Source(x(2, 5), f"p{i}") if dim == 0 else Source(x(6, 2 + i), f"p{i}") for i in range(3)]
    concat = build("concat", {"dim": dim}, parts)
    explicit_vs_autograd(concat, parts)
    assert tuple(concat.data.feature.shape[1:]) == concat.shape


@pytest.mark.parametrize("type_name", ["split", "bridge_src", "bridge_dst"])
def test_split_and_bridges_pass_features_and_gradients(type_name):
    src = Source(x(4, 3))
    layer = build(type_name, {}, [src])
    explicit_vs_autograd(layer, [src])
    if type_name == "bridge_dst":
        # autograd pass forward, explicit pass forward + backward: 3 transfers of 4x3 float64
        assert layer.bytes_moved == 3 * 4 * 3 * 8


def test_parsers_scale_records():
    data = layer_class("data")("data", {})
    data.setup([], {"input_shapes": {"pixel": (4,), "label": ()}})
    mnist = layer_class("mnist")("mnist", {"field": "pixel", "norm_a": 127.5, "norm_b": 1.0})
    mnist.setup([data], mnist.conf)
    label = layer_class("label")("label", {})
    label.setup([data], {})
    data.records = {"pixel": torch.tensor([[0, 255, 127, 128]], dtype=torch.uint8), "label": torch.tensor([3])}
    mnist.compute_feature([data])
    label.compute_feature([data])
    torch.testing.assert_close(mnist.data.feature, torch.tensor([[-1.0, 1.0, 127 / 127.5 - 1, 128 / 127.5 - 1]]))
    assert mnist.shape == (4,) and label.data.feature.tolist() == [3]
