"""Partitioning inside a worker group (section 5.2, Appendix B).

Each layer gets a ``partition_dim``: 0 (data: every node holds the whole layer and processes
its slice of the mini-batch), 1 (feature/model: every node holds a block of the layer's
neurons and parameters for the whole batch) or None (one node holds it whole).  The
``PartitionedNet`` splits layers into sub-layers with a residence ``location`` and inserts the
utility layers (slice, concat, split, bridge_src/bridge_dst) that connect them, so users' layers
never see the partitioning beyond ``setup_after_partition``.

``PartitionedNet.train_bp`` runs every node's layers in one process (the reference: bridges
count what would cross).  A ``WorkerGroup`` runs the nodes as separate Ray actors
(``group_nodes.py``): each executes only the layers at its ``location`` and the bridge pairs
really send features forward and gradients back between them.

``hybrid`` picks per layer the dim with the smaller estimated traffic per step (float32):
    data : 2 (K-1) P * 4       replicas exchange gradients/parameters of P params
    model: 2 (K-1) B (I + O/K) * 4   the input feature (I per image) goes to every node and its
                                     gradient comes back; output blocks (O) are gathered
so layers with big features and few parameters (convolutions) get data partitioning and a big
inner-product layer gets model partitioning, as in Appendix B.
"""
from __future__ import annotations

import numpy as np
import torch

from .layers import Layer, layer_class
from .layers.connection import piece_bounds
from .model import NeuralNet
from .settings import SCHEMES


def estimate_costs(layer: Layer, group_size: int, batch_size: int) -> dict[int, float]:
    """Bytes moved per step by each allowed partition dim of ``layer`` (see module doc)."""
    k, costs = group_size, {}
    num_params = sum(p.size for p in layer.params)
    if 0 in layer.partition_dims:
        costs[0] = 2.0 * (k - 1) * num_params * 4
    if 1 in layer.partition_dims:
        in_size = sum(s.feature_size for s in layer.src_layers)
        costs[1] = 2.0 * (k - 1) * batch_size * (in_size + layer.feature_size / k) * 4
    return costs


def plan_partition(net: NeuralNet, group_size: int, scheme: str, batch_size: int) -> dict[str, dict]:
    """Per layer: ``{"dim": 0 | 1 | None, "costs": {dim: bytes}}``.  An explicit
    ``partition_dim`` in a layer's YAML entry wins over the scheme."""
    if scheme not in SCHEMES:
        raise ValueError(f"partition scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    plan = {}
    for layer in net.layers:
        movable = layer.needs_grad and not layer.is_loss and layer.partition_dims and group_size > 1
        costs = estimate_costs(layer, group_size, batch_size) if movable else {}
        dim = None
        if movable:
            if "partition_dim" in layer.conf and layer.conf["partition_dim"] is not None:
                dim = int(layer.conf["partition_dim"])
                if dim not in layer.partition_dims:
                    raise ValueError(f"layer {layer.name}: partition_dim {dim} not in {layer.partition_dims}")
            elif scheme == "data":
                dim = 0 if 0 in layer.partition_dims else None
            elif scheme == "model":
                dim = 1 if 1 in layer.partition_dims else None
            elif scheme == "hybrid":
                dim = min(costs, key=lambda d: (costs[d], d))
        plan[layer.name] = {"dim": dim, "costs": costs}
    return plan


class PartitionedNet(NeuralNet):
    """The net of ``base`` split over ``group_size`` nodes by ``plan``.  Parameter access
    (``get_params``/``set_params``/``get_grads``) speaks the unpartitioned names and shapes."""

    def __init__(self, base: NeuralNet, group_size: int, plan: dict[str, dict]):
        self.input_shapes = base.input_shapes
        self.group_size = group_size
        self.plan = plan
        self.layers: list[Layer] = []
        self._rep: dict[str, tuple] = {}     # original name -> ("whole", layer) | ("split", dim, subs)
        self._cache: dict[tuple, Layer] = {}
        self._param_map: dict[str, list] = {}  # original param name -> [(sub Param, axis or None)]
        self._base_params = {p.name: p for p in base.params}
        for layer in base.layers:
            dim = plan.get(layer.name, {}).get("dim")
            self._place(layer, dim)
        self.by_name = {layer.name: layer for layer in self.layers}
        where = {id(p): layer.location for layer in self.layers for p in layer.params}
        # piece "<param>#<i>" (the i-th entry of _param_map[param]) -> the node that holds it
        self.piece_location = {f"{name}#{i}": where[id(sp)] for name, entries in self._param_map.items()
                               for i, (sp, _) in enumerate(entries)}
        self.set_params({p.name: p.val.numpy() for p in base.params})

    # -- building ---------------------------------------------------------------------------
    def _add(self, layer: Layer, srcs: list[Layer], conf: dict) -> Layer:
        layer.setup(srcs, conf)
        self.layers.append(layer)
        return layer

    def _util(self, type_name: str, name: str, location: int, srcs: list[Layer], **conf) -> Layer:
        conf = {"name": name, "type": type_name, "location": location, **conf}
        layer = self._add(layer_class(type_name)(name, conf), srcs, conf)
        # A slice of the input wants no gradient, nor does a bridge carrying it: none is sent.
        layer.needs_grad = any(s.needs_grad for s in srcs)
        return layer

    def _place(self, layer: Layer, dim: int | None) -> None:
        original_srcs = list(layer.src_layers)
        if dim is None:
            # Whole on node 0: the original object, rewired to whole versions of its sources.
            if layer.is_input:
                self.layers.append(layer)
            else:
                layer.src_layers = [self._whole(s) for s in original_srcs]
                self.layers.append(layer)
            self._rep[layer.name] = ("whole", layer)
            for p in layer.params:
                self._param_map.setdefault(p.name, []).append((p, None))
            return
        subs = []
        for k in range(self.group_size):
            srcs = [self._piece(s, dim, k, layer.elementwise) for s in original_srcs]
            conf = dict(layer.conf, name=f"{layer.name}@{k}", location=k)
            sub = layer_class(layer.type)(layer.name, conf)  # same param names: <layer>/<param>
            sub.name = conf["name"]
            sub.location = k
            sub.setup(srcs, conf)
            shape = list(layer.shape)
            if dim == 1:
                lo, hi = piece_bounds(shape[0], self.group_size, k)
                shape[0] = hi - lo
            sub.setup_after_partition(srcs, conf, tuple(shape))
            self.layers.append(sub)
            subs.append(sub)
            for sp, op in zip(sub.params, layer.params):
                sp.name = op.name
                axis = next((a for a, (x, y) in enumerate(zip(sp.val.shape, op.val.shape)) if x != y), None)
                self._param_map.setdefault(op.name, []).append((sp, axis))
        self._rep[layer.name] = ("split", dim, subs)

    def _whole(self, src: Layer) -> Layer:
        """A layer on node 0 producing ``src``'s full feature (concat of its pieces if split)."""
        if src.name not in self._rep:
            # The later half of an undirected RBM pair (rbm_visible <-> rbm_hidden): RBM layers
            # are never split, so it will be placed whole on node 0 as this very object.
            return src
        rep = self._rep[src.name]
        if rep[0] == "whole":
            return rep[1]
        key = (src.name, "whole")
        if key not in self._cache:
            _, dim, subs = rep
            parts = [sub if sub.location == 0 else self._bridge(sub, 0) for sub in subs]
            self._cache[key] = self._util("concat", f"{src.name}#concat", 0, parts, dim=dim)
        return self._cache[key]

    def _bridge(self, src: Layer, location: int) -> Layer:
        key = (src.name, "bridge", location)
        if key not in self._cache:
            out = self._util("bridge_src", f"{src.name}#bsrc>{location}", src.location, [src], peer=location)
            self._cache[key] = self._util("bridge_dst", f"{src.name}#bdst>{location}", location, [out],
                                          peer=src.location)
        return self._cache[key]

    def _piece(self, src: Layer, dim: int, k: int, elementwise: bool) -> Layer:
        """What sub-layer ``k`` of a layer partitioned on ``dim`` reads from ``src``."""
        rep = self._rep[src.name]
        if rep[0] == "split" and rep[1] == dim and (dim == 0 or elementwise):
            return rep[2][k]  # matching pieces on the same node: no transfer
        whole = self._whole(src)
        if dim == 0:
            key = (src.name, "slice", k)
            if key not in self._cache:
                self._cache[key] = self._util("slice", f"{src.name}#slice{k}", 0, [whole],
                                              dim=0, num_slices=self.group_size, index=k)
            piece = self._cache[key]
        else:
            piece = whole
        return piece if k == 0 else self._bridge(piece, k)

    # -- parameters in unpartitioned names --------------------------------------------------------
    @property
    def params(self):
        return [sp for entries in self._param_map.values() for sp, _ in entries]

    def get_params(self) -> dict[str, np.ndarray]:
        out = {}
        for name, entries in self._param_map.items():
            axis = entries[0][1]
            if axis is None:
                out[name] = entries[0][0].val.numpy().copy()
            else:
                out[name] = torch.cat([sp.val for sp, _ in entries], dim=axis).numpy()
        return out

    def get_grads(self) -> dict[str, np.ndarray]:
        out = {}
        for name, entries in self._param_map.items():
            axis = entries[0][1]
            if axis is None:  # data replicas: each saw part of the batch, gradients add up
                out[name] = sum(sp.grad for sp, _ in entries).numpy()
            else:
                out[name] = torch.cat([sp.grad for sp, _ in entries], dim=axis).numpy()
        return out

    def set_params(self, values: dict[str, np.ndarray], strict: bool = True) -> None:
        for name, value in values.items():
            if name not in self._param_map:
                if strict:
                    raise KeyError(f"no parameter {name!r}")
                continue
            full = torch.from_numpy(np.array(value, dtype=np.float32))
            entries = self._param_map[name]
            axis = entries[0][1]
            for i, (sp, _) in enumerate(entries):
                if axis is None:
                    sp.val.copy_(full.view_as(sp.val))
                else:
                    lo, hi = piece_bounds(full.shape[axis], len(entries), i)
                    sp.val.copy_(full.narrow(axis, lo, hi - lo))

    # -- pieces: what one node holds, for the actors of group_nodes.py ---------------------------
    def pieces(self, location: int, field: str = "val") -> dict[str, np.ndarray]:
        """The ``val`` (or ``grad``) of the parameter pieces on node ``location``, keyed
        ``<param>#<i>``: what that node's actor receives (values) or sends back (gradients)."""
        return {key: getattr(self._param_piece(key), field).numpy() for key, loc in self.piece_location.items()
                if loc == location}

    def load_pieces(self, values: dict[str, np.ndarray], field: str = "val") -> None:
        for key, value in values.items():
            piece = self._param_piece(key)
            # np.array copies: arrays from ray.get are read-only (GROUND.md)
            tensor = torch.from_numpy(np.array(value, dtype=np.float32)).view_as(piece.val)
            if field == "val":
                piece.val.copy_(tensor)  # in place: layers may hold views of their params
            else:
                piece.grad = tensor

    def _param_piece(self, key: str):
        name, i = key.rsplit("#", 1)
        return self._param_map[name][int(i)][0]

    def bridge_bytes(self) -> int:
        """Bytes that crossed between nodes of the group so far (features and gradients)."""
        return sum(getattr(layer, "bytes_moved", 0) for layer in self.layers if layer.type == "bridge_dst")

    def describe_plan(self) -> dict[str, str]:
        names = {0: "data", 1: "model", None: "whole"}
        return {n: names[p["dim"]] for n, p in self.plan.items()}


def partition_net(base: NeuralNet, group_size: int, scheme: str, batch_size: int) -> NeuralNet:
    """``base`` itself when there is nothing to split, else a ``PartitionedNet``."""
    plan = plan_partition(base, group_size, scheme, batch_size)
    if group_size <= 1 or all(p["dim"] is None for p in plan.values()):
        return base
    return PartitionedNet(base, group_size, plan)
