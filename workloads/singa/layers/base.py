"""The SINGA layer contract (Wang et al., section 3, Fig. 2) and the registry of layer types.

A layer owns ``data`` (its feature blob and the loss gradient w.r.t. that feature), ``params``
(each a ``Param`` with ``val`` and ``grad``), and the meta fields ``type``, ``name``, ``shape``
and ``src_layers``.  The runtime (``model.py``) calls the four methods of the paper:

    setup(src_layers, conf)                          shapes, blobs, parameter init
    setup_after_partition(src_layers, conf, shape)   re-shape after partitioning (section 5.2)
    compute_feature(src_layers, phase)               features, bottom-up
    compute_gradient(src_layers)                     param grads + grads of the src features

Built-in layers compute gradients explicitly on torch tensors (no autograd).  A user layer may
subclass ``AutogradLayer`` and write only ``forward``: its gradients then come from autograd.
Feature shapes never include the batch dimension: ``shape == (64,)`` for a batch ``(B, 64)``.
"""
from __future__ import annotations

import importlib
import math
from typing import Any

import torch

# name -> "module:Class" (built-ins, imported lazily) or a class (registered by user code)
LAYER_TYPES: dict[str, Any] = {}
# Packages may offer layer types without being named in singa.layer_modules:
#   [project.entry-points."orchard.singa_layers"]
#   mylayers = "mypkg.layers"        (a module whose import registers its layers)
ENTRY_POINT_GROUP = "orchard.singa_layers"


def register_layer(type_name: str):
    """Class decorator: make a layer type available to YAML nets as ``type: <type_name>``."""
    def wrap(cls):
        cls.type = type_name
        LAYER_TYPES[type_name] = cls
        return cls
    return wrap


def import_layer_modules(modules) -> None:
    """Import the user's layer modules (``singa.layer_modules``): their ``@register_layer``
    classes become YAML layer types.  Called wherever a net is built: the driver, every worker
    group's actor and every node actor of a partitioned group, so a user layer exists in each
    process.  Raises ``ImportError`` with one line naming the module."""
    for name in modules or ():
        try:
            importlib.import_module(str(name))
        except Exception as exc:  # a syntax error in the user's module is as fatal as a missing one
            raise ImportError(f"cannot import layer module {name!r}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


_ENTRY_POINTS_LOADED = False


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def layer_class(type_name: str):
    """Resolve a layer type name to its class (lazy import for built-ins, then the
    ``orchard.singa_layers`` entry points)."""
    if type_name not in LAYER_TYPES:
        from . import BUILTIN_MODULES  # noqa: F401  (fills LAYER_TYPES)
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
    if type_name not in LAYER_TYPES:
        _load_entry_points()
    if type_name not in LAYER_TYPES:
        raise KeyError(f"unknown layer type {type_name!r} (add your own with singa.layer_modules); "
                       f"known: {', '.join(sorted(LAYER_TYPES))}")
    return LAYER_TYPES[type_name]


def source_count(cls) -> tuple[int, int | None] | None:
    """How many ``srclayers`` a layer type takes: ``(min, max)`` (max None: any), or None when
    the type does not say.  ``num_sources`` on the class wins; an ``AutogradLayer`` without it
    takes as many sources as its ``forward`` has positional arguments."""
    n = getattr(cls, "num_sources", None)
    if n is not None:
        return (n, n) if isinstance(n, int) else (int(n[0]), None if n[1] is None else int(n[1]))
    if issubclass(cls, AutogradLayer) and cls.forward is not AutogradLayer.forward:
        import inspect

        kinds = [p.kind for p in list(inspect.signature(cls.forward).parameters.values())[1:]]
        if inspect.Parameter.VAR_POSITIONAL in kinds:
            return None
        positional = sum(k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                         for k in kinds)
        return (positional, positional)
    return None


class Blob:
    """A feature tensor (B, *shape) and the gradient of the loss w.r.t. it (same shape)."""

    __slots__ = ("feature", "grad")

    def __init__(self):
        self.feature: torch.Tensor | None = None
        self.grad: torch.Tensor | None = None

    def accumulate(self, grad: torch.Tensor) -> None:
        """Add a gradient from one destination layer (a feature may feed several layers)."""
        self.grad = grad if self.grad is None else self.grad + grad


class Param:
    """A parameter: ``val`` and ``grad`` tensors plus its per-parameter update multipliers."""

    def __init__(self, name: str, shape: tuple[int, ...], conf: dict | None = None,
                 fan_in: int | None = None, fan_out: int | None = None):
        conf = conf or {}
        self.name = name
        self.lr_mult = float(conf.get("lr_mult", 1.0))
        self.wd_mult = float(conf.get("wd_mult", 1.0))
        self.val = init_tensor(shape, conf.get("init", "constant"), conf, fan_in, fan_out)
        self.grad = torch.zeros_like(self.val)

    @property
    def size(self) -> int:
        return self.val.numel()


def init_tensor(shape, method: str, conf: dict, fan_in: int | None, fan_out: int | None) -> torch.Tensor:
    """Parameter init: constant | uniform (+-scale) | gaussian (std) | xavier (uniform, Glorot)."""
    shape = tuple(int(s) for s in shape)
    if method == "constant":
        return torch.full(shape, float(conf.get("value", 0.0)))
    if method == "uniform":
        scale = float(conf.get("scale", 0.05))
        return torch.empty(shape).uniform_(-scale, scale)
    if method == "gaussian":
        return torch.randn(shape) * float(conf.get("std", 0.01)) + float(conf.get("mean", 0.0))
    if method == "xavier":
        limit = math.sqrt(6.0 / float((fan_in or 1) + (fan_out or 1)))
        return torch.empty(shape).uniform_(-limit, limit)
    raise ValueError(f"unknown init {method!r}: constant | uniform | gaussian | xavier")


class Layer:
    """Base layer.  Subclasses override the four methods; ``self.conf`` is the YAML entry."""

    type = "base"
    # Which partition dims (section 5.2) this layer can take: 0 = data (batch), 1 = feature.
    partition_dims: tuple[int, ...] = (0,)
    # Feature-partitioned sub-layers may take the matching feature slice of a feature-partitioned
    # source (element-wise layers) instead of the whole source feature.
    elementwise = False
    is_loss = False
    is_input = False
    # Input and parser layers set this False: nobody back-propagates into raw records.
    needs_grad = True
    # True for a bridge end whose peer lives in another process: it runs in every backward
    # pass, with or without a local gradient, because the other end waits for it.
    remote = False
    # How many srclayers the type takes: an int, (min, max) with max None for "any", or None
    # (not checked).  ``NeuralNet`` rejects a missing or extra source before anything runs.
    num_sources: int | tuple | None = None
    # True for the two ends of an undirected connection (RBM visible/hidden): only a pair of
    # such layers may name each other as sources; any other cycle is an error.
    undirected = False

    def __init__(self, name: str, conf: dict | None = None):
        self.name = name
        self.conf = dict(conf or {})
        self.data = Blob()
        self.params: list[Param] = []
        self.src_layers: list[Layer] = []
        self.shape: tuple[int, ...] = ()
        self.location = int(self.conf.get("location", 0))  # node of the worker group holding it

    # -- the contract ------------------------------------------------------------------------
    def setup(self, src_layers: list["Layer"], conf: dict) -> None:
        """Read shapes from the sources and the conf; create params.  Default: keep src shape."""
        self.src_layers = list(src_layers)
        self.shape = tuple(src_layers[0].shape) if src_layers else tuple(conf.get("shape", ()))

    def setup_after_partition(self, src_layers: list["Layer"], conf: dict, shape: tuple[int, ...]) -> None:
        """Re-setup with the partitioned feature shape (the only place a layer sees partitioning)."""
        self.src_layers = list(src_layers)
        self.shape = tuple(shape)

    def compute_feature(self, src_layers: list["Layer"], phase: str = "train") -> None:
        raise NotImplementedError

    def compute_gradient(self, src_layers: list["Layer"]) -> None:
        """Default for parameter-free layers that need no gradient (data, labels)."""

    # -- helpers -------------------------------------------------------------------------------
    def param(self, suffix: str, shape, conf_key: str, default_init: dict,
              fan_in: int | None = None, fan_out: int | None = None) -> Param:
        """Create ``<name>/<suffix>`` from ``conf[conf_key]`` (init, lr_mult, wd_mult)."""
        spec = dict(default_init)
        spec.update(self.conf.get(conf_key) or {})
        p = Param(f"{self.name}/{suffix}", shape, spec, fan_in, fan_out)
        self.params.append(p)
        return p

    @property
    def feature_size(self) -> int:
        return int(math.prod(self.shape)) if self.shape else 1

    def __repr__(self) -> str:
        srcs = ",".join(s.name for s in self.src_layers)
        return f"{type(self).__name__}({self.name!r}, shape={self.shape}, src=[{srcs}], loc={self.location})"


class AutogradLayer(Layer):
    """A user layer that writes only ``forward(*src_features) -> feature`` and its ``setup``;
    gradients for its params and sources come from torch.autograd (opt-in, per the issue)."""

    def forward(self, *features: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def compute_feature(self, src_layers, phase="train"):
        if phase != "train":  # no gradient will be asked for: no graph
            with torch.no_grad():
                self.data.feature = self.forward(*[s.data.feature for s in src_layers])
            self._out = None
            return
        self._inputs = [s.data.feature.detach().requires_grad_(True) for s in src_layers]
        # ``forward`` reads ``param.val``: during the call each val is a leaf alias that
        # requires grad (same storage), so the Param itself never requires grad and in-place
        # updates (updaters, fresh values from servers or peers) stay legal.
        originals = [p.val for p in self.params]
        self._leaves = [v.detach().requires_grad_(True) for v in originals]
        try:
            for p, leaf in zip(self.params, self._leaves):
                p.val = leaf
            with torch.enable_grad():
                self._out = self.forward(*self._inputs)
        finally:
            for p, v in zip(self.params, originals):
                p.val = v
        self.data.feature = self._out.detach()

    def compute_gradient(self, src_layers):
        if self._out is None or not self._out.requires_grad:
            for p in self.params:
                p.grad = torch.zeros_like(p.val)
            return
        grads = torch.autograd.grad(self._out, self._inputs + self._leaves, self.data.grad, allow_unused=True)
        for src, g in zip(src_layers, grads[: len(src_layers)]):
            if g is not None and src.needs_grad:
                src.data.accumulate(g)
        for p, g in zip(self.params, grads[len(src_layers):]):
            p.grad = torch.zeros_like(p.val) if g is None else g
        self._out = None
