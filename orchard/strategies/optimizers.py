"""Optimizers in numpy for parameter servers, with the same update rules as ``torch.optim``
(SGD with momentum and weight decay, AdaGrad, Adam), so a ring run and a ps run of the same
config follow the same math.  ``torch_optimizer`` builds the matching torch optimizer."""
from __future__ import annotations

import numpy as np

NAMES = ("sgd", "adagrad", "adam")


class NumpyOptimizer:
    def __init__(self, spec: dict):
        self.name = spec.get("name", "sgd")
        if self.name not in NAMES:
            raise ValueError(f"optimizer.name must be one of {NAMES}, got {self.name!r}")
        self.lr = float(spec.get("lr", 0.01))
        self.momentum = float(spec.get("momentum", 0.0))
        self.wd = float(spec.get("weight_decay", 0.0))
        self.betas = tuple(spec.get("betas", (0.9, 0.999)))
        self.eps = float(spec.get("eps", 1e-8 if self.name == "adam" else 1e-10))
        self.slots: dict[str, dict[str, np.ndarray]] = {}
        self.t = 0

    def slots_for(self, size: int) -> dict[str, np.ndarray]:
        """Zeroed optimizer state for ``size`` parameters (zero momentum equals torch's
        first-step ``buf = g``; zero moments are Adam's own start)."""
        names = {"sgd": ("m",) if self.momentum else (), "adagrad": ("sum",), "adam": ("m", "v")}[self.name]
        return {k: np.zeros(size, np.float32) for k in names}

    def update(self, p: np.ndarray, g: np.ndarray, slot: dict[str, np.ndarray], t: int,
               lr_scale: float = 1.0) -> np.ndarray:
        """One step for one array (or a flat vector of many): returns the new parameters and
        updates ``slot`` (from ``slots_for``, same shape as ``p``) in place; ``t`` counts this
        array's steps from 1 (Adam's bias correction); ``lr_scale`` scales this step's rate."""
        lr = self.lr * lr_scale
        g = g + self.wd * p if self.wd else g
        if self.name == "sgd":
            if self.momentum:
                m = slot["m"]
                m *= self.momentum
                m += g
                g = m
            return (p - lr * g).astype(np.float32, copy=False)
        if self.name == "adagrad":
            acc = slot["sum"]
            acc += g * g
            return (p - lr * g / (np.sqrt(acc) + self.eps)).astype(np.float32, copy=False)
        b1, b2 = self.betas
        m, v = slot["m"], slot["v"]
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        # torch's form: lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
        denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + self.eps
        return (p - (lr / (1 - b1 ** t)) * m / denom).astype(np.float32, copy=False)

    def apply(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """New parameter arrays after one step; ``grads`` covers a subset of ``params``."""
        self.t += 1
        out = dict(params)
        for name, g in grads.items():
            p = params[name]
            slot = self.slots.get(name)
            if slot is None:
                slot = self.slots[name] = {k: v.reshape(p.shape) for k, v in self.slots_for(p.size).items()}
                slot["t"] = 0
            slot["t"] += 1
            out[name] = self.update(p, np.asarray(g, np.float32), slot, slot["t"])
        return out

    def state_dict(self) -> dict:
        return {"slots": self.slots, "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.slots = {k: {s: (np.array(v) if not isinstance(v, int) else v) for s, v in d.items()}
                      for k, d in state.get("slots", {}).items()}
        self.t = int(state.get("t", 0))


def torch_optimizer(spec: dict, params):
    """The torch.optim optimizer with the same update rule as ``NumpyOptimizer(spec)``."""
    import torch

    name = spec.get("name", "sgd")
    lr, wd = float(spec.get("lr", 0.01)), float(spec.get("weight_decay", 0.0))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(spec.get("momentum", 0.0)), weight_decay=wd)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=wd, eps=float(spec.get("eps", 1e-10)))
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd, betas=tuple(spec.get("betas", (0.9, 0.999))),
                                eps=float(spec.get("eps", 1e-8)))
    raise ValueError(f"optimizer.name must be one of {NAMES}, got {name!r}")
