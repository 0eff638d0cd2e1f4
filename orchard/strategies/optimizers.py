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

    def apply(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """New parameter arrays after one step; ``grads`` covers a subset of ``params``."""
        self.t += 1
        out = dict(params)
        for name, g in grads.items():
            p = params[name]
            g = g + self.wd * p if self.wd else g
            slot = self.slots.setdefault(name, {})
            if self.name == "sgd":
                if self.momentum:
                    buf = slot.get("m")
                    buf = g.copy() if buf is None else self.momentum * buf + g
                    slot["m"] = buf
                    g = buf
                out[name] = p - self.lr * g
            elif self.name == "adagrad":
                acc = slot.get("sum", np.zeros_like(p)) + g * g
                slot["sum"] = acc
                out[name] = p - self.lr * g / (np.sqrt(acc) + self.eps)
            else:  # adam
                b1, b2 = self.betas
                slot["t"] = slot.get("t", 0) + 1
                m = b1 * slot.get("m", np.zeros_like(p)) + (1 - b1) * g
                v = b2 * slot.get("v", np.zeros_like(p)) + (1 - b2) * g * g
                slot["m"], slot["v"] = m, v
                mhat = m / (1 - b1 ** slot["t"])
                vhat = v / (1 - b2 ** slot["t"])
                out[name] = p - self.lr * mhat / (np.sqrt(vhat) + self.eps)
            out[name] = out[name].astype(np.float32, copy=False)
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
