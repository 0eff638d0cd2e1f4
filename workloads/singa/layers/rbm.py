"""RBM layers for contrastive divergence (section 2.2, Table 1): a visible and a hidden layer
joined by an undirected connection, so each appears in the other's ``src_layers`` (Fig. 2).

The net's CD-k (``net.NeuralNet.train_cd``) calls ``compute_feature`` with phase ``positive``
once and ``negative`` k times, then ``compute_gradient``.  The parameter gradients are those of
the negative log-likelihood as CD estimates them (Hinton 2002), so SGD minimises, as for BP:
    dW = -(v0^T h0 - vk^T hk) / B,   db_h = -mean(h0 - hk),   db_v = -mean(v0 - vk).
"""
from __future__ import annotations

import torch

from .base import Layer, register_layer


@register_layer("rbm_visible")
class RBMVisibleLayer(Layer):
    """src_layers = [input, hidden].  Positive phase: v0 = the input feature;
    negative phase: vk = sigmoid(h W^T + b_v) from the hidden layer's current sample."""

    partition_dims = ()
    num_sources = 2
    undirected = True

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        if src_layers[1].type != "rbm_hidden":
            raise ValueError(f"takes [input, its rbm_hidden], got {src_layers[1].name!r} ({src_layers[1].type}) second")
        self.shape = (src_layers[0].feature_size,)
        self.bias = self.param("bias", self.shape, "bias", {"init": "constant", "value": 0.0})
        self.metrics: dict[str, float] = {}

    def compute_feature(self, src_layers, phase="train"):
        source, hidden = src_layers
        if phase in ("positive", "train", "test"):
            self.pos = source.data.feature.reshape(source.data.feature.shape[0], -1)
            self.data.feature = self.pos
            return
        self.neg = torch.sigmoid(torch.addmm(self.bias.val, hidden.sample, hidden.weight.val.t()))
        self.data.feature = self.neg
        # Reconstruction error after one Gibbs step: what CD training should lower.
        self.metrics = {"recon_error": float((self.pos - self.neg).pow(2).sum(1).mean())}

    def compute_gradient(self, src_layers):
        self.bias.grad = -(self.pos - self.neg).mean(0)

    def test_metrics(self) -> dict[str, float]:
        """After a test-phase forward: the reconstruction error of this batch (held-out data),
        through the hidden probabilities (mean field, no sampling, so it is deterministic)."""
        hidden = self.src_layers[1]
        recon = torch.sigmoid(torch.addmm(self.bias.val, hidden.pos, hidden.weight.val.t()))
        return {"recon_error": float((self.pos - recon).pow(2).sum(1).mean())}


@register_layer("rbm_hidden")
class RBMHiddenLayer(Layer):
    """src_layers = [visible].  Holds W (vis, hid) and b_h.  Each phase computes the hidden
    probabilities and a Bernoulli sample (the sample drives the next negative phase)."""

    partition_dims = ()
    num_sources = 1
    undirected = True

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        if src_layers[0].type != "rbm_visible":
            raise ValueError(f"its source must be an rbm_visible layer, got {src_layers[0].name!r} ({src_layers[0].type})")
        num_vis = src_layers[0].shape[0]
        self.shape = (int(conf["num_output"]),)
        self.weight = self.param("weight", (num_vis, self.shape[0]), "weight",
                                 {"init": "gaussian", "std": 0.01}, fan_in=num_vis, fan_out=self.shape[0])
        self.bias = self.param("bias", self.shape, "bias", {"init": "constant", "value": 0.0})

    def compute_feature(self, src_layers, phase="train"):
        vis = src_layers[0].data.feature
        prob = torch.sigmoid(torch.addmm(self.bias.val, vis, self.weight.val))
        self.sample = torch.bernoulli(prob)
        if phase == "negative":
            self.neg = prob
        else:
            self.pos = prob
        self.data.feature = prob

    def compute_gradient(self, src_layers):
        vis = src_layers[0]
        batch = vis.pos.shape[0]
        self.weight.grad = -(vis.pos.t().mm(self.pos) - vis.neg.t().mm(self.neg)) / batch
        self.bias.grad = -(self.pos - self.neg).mean(0)
