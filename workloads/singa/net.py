"""A net built from a YAML list of layers (Fig. 3, right) and the two gradient algorithms of
Table 1: back-propagation (BP) and contrastive divergence (CD-k).

    net = NeuralNet(yaml.safe_load(open("conf/singa/apps/mlp.yaml"))["layers"],
                    input_shapes={"pixel": (64,), "label": ()})
    metrics = net.train_bp({"pixel": x, "label": y})     # then an updater applies net.params

Each layer entry: ``name``, ``type`` (a registered layer type), ``srclayers`` (names), the
type's own keys (``num_output``, ``kernel``...), param specs (``weight: {init, lr_mult...}``)
and optionally ``partition_dim`` (0 data, 1 feature; used by ``partition.py``).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np
import torch

from workloads.singa.layers import Layer, Param, layer_class


def topological_order(layer_confs: list[dict]) -> list[dict]:
    """Order layers so every source comes before its destinations (Kahn, ties by file order).
    An undirected pair (each in the other's srclayers, e.g. RBM visible/hidden) is ordered
    as listed in the file."""
    names = [c["name"] for c in layer_confs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate layer names: {dup}")
    index = {n: i for i, n in enumerate(names)}
    srcs = {c["name"]: list(_as_list(c.get("srclayers"))) for c in layer_confs}
    indegree = defaultdict(int)
    children = defaultdict(list)
    for dst, dst_srcs in srcs.items():
        for src in dst_srcs:
            if src not in index:
                raise ValueError(f"layer {dst!r}: unknown src layer {src!r}")
            if dst in srcs[src] and index[dst] < index[src]:
                continue  # undirected edge: keep only the direction of file order
            indegree[dst] += 1
            children[src].append(dst)
    ready = sorted((n for n in names if indegree[n] == 0), key=index.get)
    ordered = []
    while ready:
        name = ready.pop(0)
        ordered.append(name)
        for child in children[name]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
                ready.sort(key=index.get)
    if len(ordered) != len(names):
        raise ValueError(f"the layer graph has a cycle among {sorted(set(names) - set(ordered))}")
    return [layer_confs[index[n]] for n in ordered]


def _as_list(v) -> Iterable[str]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)


class NeuralNet:
    """Layers in topological order; BP / CD-k over them; parameters as ``Param`` objects."""

    def __init__(self, layer_confs: list[dict], input_shapes: dict[str, tuple], seed: int | None = None):
        if seed is not None:
            torch.manual_seed(seed)
        self.confs = topological_order([dict(c) for c in layer_confs])
        self.input_shapes = {k: tuple(v) for k, v in input_shapes.items()}
        self.layers: list[Layer] = [layer_class(c["type"])(c["name"], c) for c in self.confs]
        self.by_name = {layer.name: layer for layer in self.layers}
        for layer, conf in zip(self.layers, self.confs):
            src = [self.by_name[s] for s in _as_list(conf.get("srclayers"))]
            if layer.is_input:
                conf = dict(conf, input_shapes=self.input_shapes)
            # "num_output: $text" = the feature size of layer "text" (reconstruction layers
            # then fit whatever data is loaded)
            conf = {k: self.by_name[v[1:]].feature_size if isinstance(v, str) and v.startswith("$")
                    and v[1:] in self.by_name else v for k, v in conf.items()}
            layer.conf = conf
            layer.setup(src, conf)

    # -- parameters ------------------------------------------------------------------------
    @property
    def params(self) -> list[Param]:
        return [p for layer in self.layers for p in layer.params]

    def param_dict(self) -> dict[str, Param]:
        return {p.name: p for p in self.params}

    def get_params(self) -> dict[str, np.ndarray]:
        """Copies of every parameter value as float32 numpy arrays, keyed ``<layer>/<param>``."""
        return {p.name: p.val.detach().cpu().numpy().copy() for p in self.params}

    def set_params(self, values: dict[str, np.ndarray], strict: bool = True) -> None:
        """Overwrite parameter values (e.g. fresh ones from the servers)."""
        own = self.param_dict()
        for name, value in values.items():
            if name not in own:
                if strict:
                    raise KeyError(f"no parameter {name!r}")
                continue
            # np.array copies: arrays from ray.get are read-only (GROUND.md)
            own[name].val.copy_(torch.from_numpy(np.array(value, dtype=np.float32)).view_as(own[name].val))

    def get_grads(self) -> dict[str, np.ndarray]:
        return {p.name: p.grad.detach().cpu().numpy() for p in self.params}

    # -- running ----------------------------------------------------------------------------
    def feed(self, batch: dict[str, torch.Tensor]) -> None:
        for layer in self.layers:
            if layer.is_input:
                layer.records = batch

    def forward(self, batch: dict[str, torch.Tensor], phase: str = "train") -> dict[str, float]:
        """ComputeFeature bottom-up; returns the loss layers' metrics as ``<layer>/<name>``."""
        self.feed(batch)
        for layer in self.layers:
            layer.compute_feature(layer.src_layers, phase)
        return self.metrics()

    def backward(self) -> None:
        """ComputeGradient top-down (reverse topological order)."""
        for layer in self.layers:
            layer.data.grad = None
        for layer in reversed(self.layers):
            if layer.is_loss or layer.data.grad is not None or layer.remote:
                layer.compute_gradient(layer.src_layers)

    def train_bp(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One BP pass: features, then gradients of every param (``Param.grad``)."""
        metrics = self.forward(batch, "train")
        self.backward()
        return metrics

    def rbm_layers(self) -> list[Layer]:
        return [layer for layer in self.layers if layer.type.startswith("rbm_")]

    def train_cd(self, batch: dict[str, torch.Tensor], k: int = 1) -> dict[str, float]:
        """CD-k: positive phase on the data, k Gibbs steps (negative phase), then gradients of
        the RBM layers' params.  Non-RBM layers below the RBM only feed it (positive phase)."""
        self.forward(batch, "positive")
        rbm = self.rbm_layers()
        for _ in range(k):
            for layer in rbm:
                layer.compute_feature(layer.src_layers, "negative")
        for layer in reversed(rbm):
            layer.compute_gradient(layer.src_layers)
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        out = {}
        for layer in self.layers:
            for key, value in getattr(layer, "metrics", {}).items():
                out[f"{layer.name}/{key}"] = value
        return out

    @torch.no_grad()
    def features(self, batch: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
        """Test-phase features of the named layers for one batch, (B, ...) each."""
        self.forward(batch, "test")
        return {n: self.by_name[n].data.feature for n in names}

    def describe(self) -> str:
        return "\n".join(repr(layer) for layer in self.layers)
