"""Loss layers: softmax cross-entropy with accuracy (classification) and Euclidean distance
(reconstruction and the cross-modal latent difference of the MSAE, 4.3).  Both average over the
batch, so a gradient step is independent of the batch size; ``loss_weight`` scales a loss."""
from __future__ import annotations

import torch

from .base import Layer, register_layer


class _LossLayer(Layer):
    """Shared setup: shape of the first source, ``loss_weight``, and the ``metrics`` the net
    reports as ``<layer>/<name>``.  Loss layers stay whole on node 0 of a partitioned group."""

    is_loss = True
    partition_dims = ()
    num_sources = 2

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        self.shape = tuple(src_layers[0].shape)
        self.loss_weight = float(conf.get("loss_weight", 1.0))
        self.metrics: dict[str, float] = {}


@register_layer("softmax_loss")
class SoftmaxLossLayer(_LossLayer):
    """src_layers = [scores (B, K), labels (B,)]; loss = mean_i -log softmax(scores_i)[label_i]."""

    def setup(self, src_layers, conf):
        super().setup(src_layers, conf)
        self.topk = int(conf.get("topk", 1))
        scores, labels = src_layers
        if len(scores.shape) != 1 or labels.shape != ():
            raise ValueError(f"takes [scores (K,), labels ()], got {scores.name} {scores.shape} and "
                             f"{labels.name} {labels.shape}")

    def compute_feature(self, src_layers, phase="train"):
        scores, labels = src_layers[0].data.feature, src_layers[1].data.feature
        log_prob = torch.log_softmax(scores, dim=1)
        self.data.feature = log_prob.exp()  # class probabilities
        self._labels = labels
        nll = -log_prob.gather(1, labels.view(-1, 1)).mean()
        top = scores.topk(self.topk, dim=1).indices
        acc = (top == labels.view(-1, 1)).any(dim=1).float().mean()
        self.metrics = {"loss": float(nll) * self.loss_weight, "accuracy": float(acc)}

    def compute_gradient(self, src_layers):
        prob = self.data.feature
        grad = prob.clone()
        grad[torch.arange(grad.shape[0]), self._labels] -= 1.0
        src_layers[0].data.accumulate(grad * (self.loss_weight / grad.shape[0]))


@register_layer("euclidean_loss")
class EuclideanLossLayer(_LossLayer):
    """src_layers = [a, b] of equal shape; loss = loss_weight * 0.5 * mean_i ||a_i - b_i||^2.
    Both sources receive gradients when they need them (the MSAE's two latent layers do)."""

    def setup(self, src_layers, conf):
        super().setup(src_layers, conf)
        a, b = src_layers
        if a.feature_size != b.feature_size:
            raise ValueError(f"its sources differ in size: {a.name} {a.shape} vs {b.name} {b.shape}")

    def compute_feature(self, src_layers, phase="train"):
        a, b = src_layers[0].data.feature, src_layers[1].data.feature
        self._diff = (a - b).reshape(a.shape[0], -1)
        self.data.feature = self._diff
        loss = 0.5 * self._diff.pow(2).sum(1).mean()
        self.metrics = {"loss": float(loss) * self.loss_weight}

    def compute_gradient(self, src_layers):
        a, b = src_layers
        g = self._diff * (self.loss_weight / self._diff.shape[0])
        if a.needs_grad:
            a.data.accumulate(g.reshape(a.data.feature.shape))
        if b.needs_grad:
            b.data.accumulate((-g).reshape(b.data.feature.shape))
