"""Convolution, pooling and local response normalisation (the DCNN of section 4.2).

Gradients are explicit: the backward kernels are called directly (``aten.convolution_backward``,
``max_pool2d_with_indices_backward``, ``avg_pool2d_backward``) and LRN's gradient is written out;
no autograd graph is built.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Layer, register_layer


def _chw(src: Layer) -> tuple[int, int, int]:
    """The (channels, height, width) feature shape of ``src``, or a one-line error."""
    if len(src.shape) != 3:
        raise ValueError(f"needs a (channels, height, width) source; {src.name} has shape {src.shape}")
    return tuple(int(d) for d in src.shape)


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if not isinstance(v, (list, tuple)) else (int(v[0]), int(v[1]))


@register_layer("convolution")
class ConvolutionLayer(Layer):
    """(B, C, H, W) -> (B, num_filters, H', W'); weight (F, C, k, k), bias (F,).
    Feature-partitionable: a sub-layer holds a block of the filters (output channels)."""

    partition_dims = (0, 1)
    num_sources = 1

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        self.kernel = _pair(conf["kernel"])
        self.stride = _pair(conf.get("stride", 1))
        self.pad = _pair(conf.get("pad", 0))
        c, h, w = _chw(src_layers[0])
        self.channels = c
        self.out_hw = ((h + 2 * self.pad[0] - self.kernel[0]) // self.stride[0] + 1,
                       (w + 2 * self.pad[1] - self.kernel[1]) // self.stride[1] + 1)
        if min(self.out_hw) < 1:
            raise ValueError(f"kernel {self.kernel} does not fit its {h}x{w} input (pad {self.pad})")
        self.shape = (int(conf["num_filters"]),) + self.out_hw
        self._make_params(self.shape[0])

    def _make_params(self, filters):
        self.params = []
        fan_in = self.channels * self.kernel[0] * self.kernel[1]
        self.weight = self.param("weight", (filters, self.channels) + self.kernel, "weight",
                                 {"init": "gaussian", "std": 0.01}, fan_in=fan_in, fan_out=filters)
        self.bias = self.param("bias", (filters,), "bias", {"init": "constant", "value": 0.0})

    def setup_after_partition(self, src_layers, conf, shape):
        self.src_layers = list(src_layers)
        self.shape = tuple(shape)
        self._make_params(self.shape[0])

    def compute_feature(self, src_layers, phase="train"):
        self._x = src_layers[0].data.feature
        self.data.feature = F.conv2d(self._x, self.weight.val, self.bias.val, self.stride, self.pad)

    def compute_gradient(self, src_layers):
        need_input = src_layers[0].needs_grad
        gx, gw, gb = torch.ops.aten.convolution_backward(
            self.data.grad, self._x, self.weight.val, [self.shape[0]], list(self.stride),
            list(self.pad), [1, 1], False, [0, 0], 1, [need_input, True, True])
        self.weight.grad, self.bias.grad = gw, gb
        if need_input:
            src_layers[0].data.accumulate(gx)


@register_layer("pooling")
class PoolingLayer(Layer):
    """Max or average pooling, ceil-mode output size as in cuda-convnet/Caffe (32 -> 16 for 3/2)."""

    partition_dims = (0, 1)
    elementwise = True  # channel blocks pool independently
    num_sources = 1

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        self.pool = conf.get("pool", "max")
        if self.pool not in ("max", "avg"):
            raise ValueError(f"pool {self.pool!r}: max or avg")
        self.kernel = _pair(conf["kernel"])
        self.stride = _pair(conf.get("stride", 1))
        c, h, w = _chw(src_layers[0])
        out = [-(-(d - k) // s) + 1 for d, k, s in zip((h, w), self.kernel, self.stride)]
        if min(out) < 1:
            raise ValueError(f"kernel {self.kernel} does not fit its {h}x{w} input")
        self.shape = (c, out[0], out[1])

    def setup_after_partition(self, src_layers, conf, shape):
        self.src_layers = list(src_layers)
        self.shape = tuple(shape)

    def compute_feature(self, src_layers, phase="train"):
        x = self._x = src_layers[0].data.feature
        if self.pool == "max":
            self.data.feature, self._idx = F.max_pool2d(x, self.kernel, self.stride, 0, ceil_mode=True,
                                                        return_indices=True)
        else:
            self.data.feature = F.avg_pool2d(x, self.kernel, self.stride, 0, ceil_mode=True,
                                             count_include_pad=True)

    def compute_gradient(self, src_layers):
        if not src_layers[0].needs_grad:
            return
        g = self.data.grad
        if self.pool == "max":
            gx = torch.ops.aten.max_pool2d_with_indices_backward(
                g, self._x, list(self.kernel), list(self.stride), [0, 0], [1, 1], True, self._idx)
        else:
            gx = torch.ops.aten.avg_pool2d_backward(
                g, self._x, list(self.kernel), list(self.stride), [0, 0], True, True, None)
        src_layers[0].data.accumulate(gx)


@register_layer("lrn")
class LRNLayer(Layer):
    """Cross-channel local response normalisation (AlexNet/Caffe ACROSS_CHANNELS):
    b_c = a_c / s_c^beta with s_c = k + alpha/n * sum_{|j-c|<=n//2} a_j^2."""

    partition_dims = (0,)  # needs neighbouring channels: never split by feature
    num_sources = 1

    def setup(self, src_layers, conf):
        super().setup(src_layers, conf)
        _chw(src_layers[0])
        self.size = int(conf.get("local_size", 3))
        self.alpha = float(conf.get("alpha", 5e-5))
        self.beta = float(conf.get("beta", 0.75))
        self.knorm = float(conf.get("knorm", 1.0))

    def _window_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the channel window of size n around each channel, zero padded."""
        half = self.size // 2
        padded = F.pad(t, (0, 0, 0, 0, half, self.size - 1 - half))
        c = t.shape[1]
        out = padded[:, 0:c].clone()
        for d in range(1, self.size):
            out += padded[:, d:d + c]
        return out

    def compute_feature(self, src_layers, phase="train"):
        a = self._x = src_layers[0].data.feature
        self._scale = self.knorm + (self.alpha / self.size) * self._window_sum(a * a)
        self.data.feature = a * self._scale.pow(-self.beta)

    def compute_gradient(self, src_layers):
        a, s, b, g = self._x, self._scale, self.data.feature, self.data.grad
        # d b_c / d a_j = [c==j] s_c^-beta - 2 alpha beta / n * a_c a_j s_c^(-beta-1) for j in window(c);
        # the window is symmetric, so the second term gathers with the same window sum.
        ratio = self._window_sum(g * b / s)
        gx = g * s.pow(-self.beta) - (2.0 * self.alpha * self.beta / self.size) * a * ratio
        src_layers[0].data.accumulate(gx)
