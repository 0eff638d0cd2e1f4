"""Utility layers that partitioning inserts (section 5.2, Appendix B): slice, concat, split
(replicate) and the bridge pair that moves features and gradients between nodes of a group.

Users never write these: ``partition.py`` inserts them.  ``dim`` is the tensor dimension:
0 = the batch (data partitioning), 1 = the first feature dimension (model partitioning).
"""
from __future__ import annotations

import torch

from .base import Layer, register_layer


def split_sizes(total: int, parts: int) -> list[int]:
    """Near-equal sizes, larger ones first: split_sizes(10, 3) == [4, 3, 3]."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def piece_bounds(total: int, parts: int, index: int) -> tuple[int, int]:
    sizes = split_sizes(total, parts)
    start = sum(sizes[:index])
    return start, start + sizes[index]


@register_layer("slice")
class SliceLayer(Layer):
    """Piece ``index`` of ``num_slices`` of its source along ``dim`` (one layer per piece)."""

    num_sources = 1

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        self.dim = int(conf.get("dim", 0))
        self.num_slices = int(conf["num_slices"])
        self.index = int(conf["index"])
        shape = list(src_layers[0].shape)
        if self.dim >= 1:
            lo, hi = piece_bounds(shape[self.dim - 1], self.num_slices, self.index)
            shape[self.dim - 1] = hi - lo
        self.shape = tuple(shape)

    def compute_feature(self, src_layers, phase="train"):
        x = src_layers[0].data.feature
        lo, hi = piece_bounds(x.shape[self.dim], self.num_slices, self.index)
        self._full_shape = x.shape
        self._bounds = (lo, hi)
        self.data.feature = x.narrow(self.dim, lo, hi - lo)

    def compute_gradient(self, src_layers):
        if not src_layers[0].needs_grad:
            return
        lo, hi = self._bounds
        full = torch.zeros(self._full_shape, dtype=self.data.grad.dtype)
        full.narrow(self.dim, lo, hi - lo).copy_(self.data.grad)
        src_layers[0].data.accumulate(full)


@register_layer("concat")
class ConcatLayer(Layer):
    """Concatenates its sources along ``dim``; the gradient is cut back into the pieces."""

    num_sources = (1, None)

    def setup(self, src_layers, conf):
        self.src_layers = list(src_layers)
        self.dim = int(conf.get("dim", 0))
        shape = list(src_layers[0].shape)
        if self.dim >= 1:
            shape[self.dim - 1] = sum(s.shape[self.dim - 1] for s in src_layers)
        self.shape = tuple(shape)

    def compute_feature(self, src_layers, phase="train"):
        parts = [s.data.feature for s in src_layers]
        self._sizes = [p.shape[self.dim] for p in parts]
        self.data.feature = torch.cat(parts, dim=self.dim)

    def compute_gradient(self, src_layers):
        for src, g in zip(src_layers, torch.split(self.data.grad, self._sizes, dim=self.dim)):
            if src.needs_grad:
                src.data.accumulate(g)


@register_layer("split")
class SplitLayer(Layer):
    """Replicates its source for several destinations (the ReplicateLayer of Appendix B);
    gradients from the destinations add up."""

    num_sources = 1

    def compute_feature(self, src_layers, phase="train"):
        self.data.feature = src_layers[0].data.feature

    def compute_gradient(self, src_layers):
        if src_layers[0].needs_grad and self.data.grad is not None:
            src_layers[0].data.accumulate(self.data.grad)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class _BridgeLayer(SplitLayer):
    """One end of a bridge pair.  Inside one process the pair is a pass-through that counts what
    would cross (``bytes_moved``, on the destination side only, so each transfer counts once).
    When ``transport`` is set (``group_nodes.py``: the two ends live in different Ray actors) the
    ends really send: the feature forward to ``peer``, its gradient back.  ``needs_grad`` is
    False when nothing upstream wants a gradient (e.g. a slice of the input): then no gradient
    crosses at all."""

    transport = None

    def setup(self, src_layers, conf):
        super().setup(src_layers, conf)
        self.peer = int(conf.get("peer", self.location))  # the node of the other end
        self.bytes_moved = 0

    @property
    def remote(self) -> bool:
        return self.transport is not None


@register_layer("bridge_src")
class BridgeSrcLayer(_BridgeLayer):
    """On the producer's node: sends the feature to its ``bridge_dst`` and takes the gradient
    back from it (SrcBridgeLayer)."""

    def compute_feature(self, src_layers, phase="train"):
        super().compute_feature(src_layers, phase)
        if self.remote:
            self.transport.send(self.peer, (self.name, "feature"), self.data.feature)

    def compute_gradient(self, src_layers):
        if self.remote and self.needs_grad:
            self.data.grad = self.transport.receive((self.name, "grad"))
        super().compute_gradient(src_layers)


@register_layer("bridge_dst")
class BridgeDstLayer(_BridgeLayer):
    """On the consumer's node: receives the feature, sends back its gradient (DstBridgeLayer)."""

    def compute_feature(self, src_layers, phase="train"):
        if self.remote:
            self.data.feature = self.transport.receive((src_layers[0].name, "feature"))
        else:
            super().compute_feature(src_layers, phase)
            self.bytes_moved += _nbytes(self.data.feature)

    def compute_gradient(self, src_layers):
        if not self.needs_grad:
            return
        if self.remote:
            # always answer (None when no destination produced a gradient): the src end waits
            self.transport.send(self.peer, (src_layers[0].name, "grad"), self.data.grad)
            return
        self.bytes_moved += _nbytes(self.data.grad)
        super().compute_gradient(src_layers)
