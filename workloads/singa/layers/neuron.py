"""Input/parser layers and fully connected neuron layers (sections 3, 4.1), explicit gradients.

``hidden`` is the paper's Fig. 3 HiddenLayer (inner product + activation in one layer, Eq. 1);
``innerproduct`` has no activation; ``tanh``/``sigmoid``/``relu`` are separate element-wise
layers (the CNN of 4.2 uses a rectifier layer after each convolution).
"""
from __future__ import annotations

import torch

from .base import Layer, register_layer


# ----------------------------------------------------------------------------- input and parsers
@register_layer("data")
class DataLayer(Layer):
    """Holds one mini-batch of records (a dict field -> tensor); the net fills ``records``.
    SINGA's DBLayer/DiskLayer: parser layers above it pull their field out."""

    is_input = True
    needs_grad = False
    num_sources = 0

    def setup(self, src_layers, conf):
        self.src_layers = []
        self.field_shapes = {k: tuple(v) for k, v in conf["input_shapes"].items()}
        self.records: dict[str, torch.Tensor] = {}
        self.shape = ()

    def compute_feature(self, src_layers, phase="train"):
        self.data.feature = None  # records are read by the parsers


class ParserLayer(Layer):
    """Base parser: ``conf.field`` names the record field this layer extracts."""

    needs_grad = False
    num_sources = 1

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        self.field = conf.get("field", self.default_field)
        if not src_layers[0].is_input:
            raise ValueError(f"reads records, so its source must be a data layer, not {src_layers[0].name!r}")
        shapes = src_layers[0].field_shapes
        if self.field not in shapes:
            raise ValueError(f"field {self.field!r} is not in the data; its fields: {', '.join(sorted(shapes))}")
        self.shape = tuple(shapes[self.field])

    def raw(self, src_layers) -> torch.Tensor:
        return src_layers[0].records[self.field]


@register_layer("label")
class LabelLayer(ParserLayer):
    """Ground-truth class ids, int64 (B,)."""

    default_field = "label"

    def compute_feature(self, src_layers, phase="train"):
        self.data.feature = self.raw(src_layers).long()


@register_layer("mnist")
class MnistLayer(ParserLayer):
    """Pixels scaled as SINGA's MnistLayer: x / norm_a - norm_b (float32, (B, H*W))."""

    default_field = "pixel"

    def setup(self, src_layers, conf):
        super().setup(src_layers, conf)
        self.norm_a = float(conf.get("norm_a", 255.0))
        self.norm_b = float(conf.get("norm_b", 0.0))

    def compute_feature(self, src_layers, phase="train"):
        self.data.feature = self.raw(src_layers).float() / self.norm_a - self.norm_b


@register_layer("rgb_image")
class RGBImageLayer(MnistLayer):
    """Colour images (B, 3, H, W): x / scale - mean, with the same two knobs as ``mnist``."""


@register_layer("feature")
class FeatureLayer(ParserLayer):
    """A float feature vector as stored (image features / bag-of-words text for msae)."""

    default_field = "feature"

    def compute_feature(self, src_layers, phase="train"):
        self.data.feature = self.raw(src_layers).float()


# ----------------------------------------------------------------------------- fully connected
_ACTIVATIONS = {
    # name: (f(x), f'(x) written in terms of y = f(x))
    "none": (lambda x: x, None),
    "tanh": (torch.tanh, lambda y: 1.0 - y * y),
    "sigmoid": (torch.sigmoid, lambda y: y * (1.0 - y)),
    "relu": (torch.relu, lambda y: (y > 0).to(y.dtype)),
}


@register_layer("innerproduct")
class InnerProductLayer(Layer):
    """y = x W + b with x (B, in) flattened, W (in, out), b (out,).  Feature-partitionable:
    a sub-layer holds a column block of W and b (model partitioning of 5.2)."""

    partition_dims = (0, 1)
    activation = "none"
    num_sources = 1

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        self.activation = conf.get("activation", self.activation)
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: one of {', '.join(_ACTIVATIONS)}")
        self.num_input = src_layers[0].feature_size
        if "num_output" not in conf:
            raise ValueError("needs num_output")
        self.shape = (int(conf["num_output"]),)
        self._make_params(self.shape[0])

    def _make_params(self, num_output):
        self.params = []
        self.weight = self.param("weight", (self.num_input, num_output), "weight",
                                 {"init": "xavier"}, fan_in=self.num_input, fan_out=num_output)
        self.bias = self.param("bias", (num_output,), "bias", {"init": "constant", "value": 0.0})

    def setup_after_partition(self, src_layers, conf, shape):
        self.src_layers = list(src_layers)
        self.num_input = src_layers[0].feature_size
        self.shape = tuple(shape)
        self._make_params(self.shape[0])

    def compute_feature(self, src_layers, phase="train"):
        x = src_layers[0].data.feature
        self._x = x.reshape(x.shape[0], -1)
        y = torch.addmm(self.bias.val, self._x, self.weight.val)
        f, _ = _ACTIVATIONS[self.activation]
        self.data.feature = f(y) if self.activation != "none" else y

    def compute_gradient(self, src_layers):
        grad = self.data.grad
        if self.activation != "none":
            grad = grad * _ACTIVATIONS[self.activation][1](self.data.feature)
        self.weight.grad = self._x.t().mm(grad)
        self.bias.grad = grad.sum(0)
        src = src_layers[0]
        if src.needs_grad:
            src.data.accumulate(grad.mm(self.weight.val.t()).reshape(src.data.feature.shape))


@register_layer("hidden")
class HiddenLayer(InnerProductLayer):
    """Fig. 3's HiddenLayer, Eq. 1: fea = sigma(x W + b); ``activation`` default sigmoid."""

    activation = "sigmoid"


@register_layer("tanh_hidden")
class TanhHiddenLayer(InnerProductLayer):
    """4.1's TanhHiddenLayer: Eq. 1 with tanh in place of the logistic function."""

    activation = "tanh"


class ElementwiseLayer(Layer):
    partition_dims = (0, 1)
    elementwise = True
    num_sources = 1
    kind = "none"

    def compute_feature(self, src_layers, phase="train"):
        self.data.feature = _ACTIVATIONS[self.kind][0](src_layers[0].data.feature)

    def compute_gradient(self, src_layers):
        src_layers[0].data.accumulate(self.data.grad * _ACTIVATIONS[self.kind][1](self.data.feature))


@register_layer("tanh")
class TanhLayer(ElementwiseLayer):
    kind = "tanh"


@register_layer("sigmoid")
class SigmoidLayer(ElementwiseLayer):
    kind = "sigmoid"


@register_layer("relu")
class ReLULayer(ElementwiseLayer):
    kind = "relu"


@register_layer("dropout")
class DropoutLayer(ElementwiseLayer):
    """Inverted dropout: keep with prob 1-ratio and scale by 1/(1-ratio) while training."""

    def setup(self, src_layers, conf):
        super().setup(src_layers, conf)
        self.ratio = float(conf.get("dropout_ratio", 0.5))

    def compute_feature(self, src_layers, phase="train"):
        x = src_layers[0].data.feature
        if phase != "train" or self.ratio == 0.0:
            self._mask = None
            self.data.feature = x
            return
        self._mask = (torch.rand_like(x) >= self.ratio).to(x.dtype) / (1.0 - self.ratio)
        self.data.feature = x * self._mask

    def compute_gradient(self, src_layers):
        g = self.data.grad if self._mask is None else self.data.grad * self._mask
        src_layers[0].data.accumulate(g)
