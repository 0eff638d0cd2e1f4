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

from .layers import Layer, layer_class, Param
from .layers.base import source_count


class NetError(ValueError):
    """A net that cannot be built: one line that names the layer (``layer`` when known)."""

    def __init__(self, message: str, layer: str | None = None):
        self.layer = layer
        super().__init__(message)


def check_layers(layer_confs: list[dict]) -> None:
    """Names, types, the graph and source counts of a YAML layer list, before any layer is
    built: raises ``NetError`` for a nameless or duplicate layer, an unknown type, an unknown
    source, a cycle other than a declared RBM pair, or a missing or extra source of a type that
    declares how many it takes (``Layer.num_sources``)."""
    if not isinstance(layer_confs, list) or not layer_confs:
        raise NetError("layers: a non-empty list of {name, type, srclayers, ...} entries")
    classes = []
    for i, conf in enumerate(layer_confs):
        if not isinstance(conf, dict) or not conf.get("name") or not conf.get("type"):
            raise NetError(f"layers[{i}]: every layer needs a name and a type, got {conf!r}")
        try:
            classes.append(layer_class(str(conf["type"])))
        except KeyError as exc:
            raise NetError(f"layer {conf['name']!r}: {exc.args[0]}", conf["name"]) from None
    topological_order(layer_confs)
    for conf, cls in zip(layer_confs, classes):
        want = source_count(cls)
        got = list(_as_list(conf.get("srclayers")))
        if want is not None and not (want[0] <= len(got) and (want[1] is None or len(got) <= want[1])):
            n = f"{want[0]}" if want[0] == want[1] else f"{want[0]} or more" if want[1] is None else f"{want[0]}-{want[1]}"
            what = "missing a source" if len(got) < want[0] else "an extra source"
            raise NetError(f"layer {conf['name']!r} ({conf['type']}): {what}: takes {n} srclayers, got "
                           f"{len(got)} {got}", conf["name"])


def topological_order(layer_confs: list[dict]) -> list[dict]:
    """Order layers so every source comes before its destinations (Kahn, ties by file order).
    Only an undirected pair (each in the other's srclayers) of ``undirected`` layer types (RBM
    visible/hidden) may form a cycle; it is ordered as listed in the file.  Any other cycle,
    an unknown source or a duplicate name raises ``NetError``."""
    names = [c["name"] for c in layer_confs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise NetError(f"duplicate layer names: {dup}", dup[0])
    index = {n: i for i, n in enumerate(names)}
    types = {c["name"]: c.get("type") for c in layer_confs}
    srcs = {c["name"]: list(_as_list(c.get("srclayers"))) for c in layer_confs}
    indegree = defaultdict(int)
    children = defaultdict(list)
    for dst, dst_srcs in srcs.items():
        for src in dst_srcs:
            if src not in index:
                raise NetError(f"layer {dst!r}: unknown src layer {src!r}", dst)
            if src == dst:
                raise NetError(f"layer {dst!r}: reads itself (a cycle)", dst)
            if dst in srcs[src] and index[dst] < index[src]:
                if not (_undirected(types[dst]) and _undirected(types[src])):
                    raise NetError(f"layers {dst!r} and {src!r} read each other (a cycle); only a declared RBM "
                                   f"pair (rbm_visible <-> rbm_hidden) may", dst)
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
        stuck = sorted(set(names) - set(ordered), key=index.get)
        raise NetError(f"the layers {stuck} form a cycle; only a declared RBM pair (rbm_visible <-> rbm_hidden) "
                       f"may", stuck[0])
    return [layer_confs[index[n]] for n in ordered]


def _undirected(type_name) -> bool:
    try:
        return bool(layer_class(str(type_name)).undirected)
    except KeyError:
        return False


def _as_list(v) -> Iterable[str]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)


class NeuralNet:
    """Layers in topological order; BP / CD-k over them; parameters as ``Param`` objects."""

    def __init__(self, layer_confs: list[dict], input_shapes: dict[str, tuple], seed: int | None = None):
        if seed is not None:
            torch.manual_seed(seed)
        check_layers(layer_confs)
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
            try:
                layer.setup(src, conf)
            except NetError:
                raise
            except Exception as exc:  # shape inference failed: name the layer, in one line
                raise NetError(f"layer {layer.name!r} ({layer.type}): {_one_line(exc)}", layer.name) from None

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
        if phase == "test":
            # layers whose figures need the whole pass (an RBM's held-out reconstruction error)
            for layer in self.layers:
                if hasattr(layer, "test_metrics"):
                    layer.metrics = layer.test_metrics()
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

    def dry_run(self, batch: dict[str, torch.Tensor], algorithm: str = "bp", cd_k: int = 1) -> None:
        """One BP (or CD) pass on ``batch`` with every layer's failure named: a feature or
        gradient of the wrong shape raises ``NetError`` before any training starts.  Checks
        that each parameter got a gradient of its own shape.  Leaves the parameters as they were."""
        self.feed(batch)
        phase = "positive" if algorithm == "cd" else "train"
        for layer in self.layers:
            self._named(layer, "compute_feature", layer.compute_feature, layer.src_layers, phase)
        if algorithm == "cd":
            if not self.rbm_layers():
                raise NetError("algorithm cd needs an rbm_visible/rbm_hidden pair")
            for _ in range(cd_k):
                for layer in self.rbm_layers():
                    self._named(layer, "compute_feature", layer.compute_feature, layer.src_layers, "negative")
            for layer in reversed(self.rbm_layers()):
                self._named(layer, "compute_gradient", layer.compute_gradient, layer.src_layers)
            return
        if not any(layer.is_loss for layer in self.layers):
            raise NetError("the net has no loss layer (softmax_loss, euclidean_loss, ...): BP has nothing to minimise")
        for layer in self.layers:
            layer.data.grad = None
        for layer in reversed(self.layers):
            if layer.is_loss or layer.data.grad is not None:
                self._named(layer, "compute_gradient", layer.compute_gradient, layer.src_layers)
                for src in layer.src_layers:
                    g, f = src.data.grad, src.data.feature
                    if g is not None and f is not None and tuple(g.shape) != tuple(f.shape):
                        raise NetError(f"layer {layer.name!r} ({layer.type}): gave {src.name} a gradient of shape "
                                       f"{tuple(g.shape)} for its feature of shape {tuple(f.shape)}", layer.name)
        for layer in self.layers:
            for p in layer.params:
                if p.grad is None or tuple(p.grad.shape) != tuple(p.val.shape):
                    got = None if p.grad is None else tuple(p.grad.shape)
                    raise NetError(f"layer {layer.name!r} ({layer.type}): param {p.name} got gradient shape {got}, "
                                   f"want {tuple(p.val.shape)}", layer.name)

    @staticmethod
    def _named(layer: Layer, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except NetError:
            raise
        except Exception as exc:
            raise NetError(f"layer {layer.name!r} ({layer.type}) {what}: {_one_line(exc)}", layer.name) from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
