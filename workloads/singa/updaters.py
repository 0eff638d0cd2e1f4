"""Parameter updaters (section 2.2): SGD with momentum and weight decay, plus AdaGrad and Adam.

Conventions follow Caffe/SINGA: per-param ``lr_mult`` and ``wd_mult``; the learning rate may
decay in steps (``lr_policy: step``, ``gamma`` every ``step_size`` steps).  Updates are in place
on ``Param.val`` (torch tensors), with no autograd.
"""
from __future__ import annotations

import torch

from .layers import Param
from .settings import UPDATERS


def learning_rate(conf: dict, step: int) -> float:
    """Base learning rate at ``step`` (0-based): fixed, or multiplied by gamma every step_size."""
    lr = float(conf.get("lr", 0.01))
    if conf.get("lr_policy", "fixed") == "step":
        lr *= float(conf.get("gamma", 0.1)) ** (step // int(conf.get("step_size", 1000)))
    return lr


class Updater:
    """``Updater(conf).update(params, step)`` applies one step to every ``Param``."""

    def __init__(self, conf: dict):
        self.conf = dict(conf)
        self.name = self.conf.get("name", "sgd")
        if self.name not in UPDATERS:
            raise ValueError(f"updater {self.name!r}: one of {', '.join(UPDATERS)}")
        self.momentum = float(self.conf.get("momentum", 0.0))
        self.weight_decay = float(self.conf.get("weight_decay", 0.0))
        self.beta1 = float(self.conf.get("beta1", 0.9))
        self.beta2 = float(self.conf.get("beta2", 0.999))
        self.eps = float(self.conf.get("eps", 1e-8))
        self.state: dict[str, dict[str, torch.Tensor]] = {}

    @torch.no_grad()
    def update(self, params: list[Param], step: int) -> None:
        base_lr = learning_rate(self.conf, step)
        if self.name == "sgd":
            self._sgd(params, base_lr)
            return
        for p in params:
            lr = base_lr * p.lr_mult
            if lr == 0.0:
                continue
            g = p.grad
            wd = self.weight_decay * p.wd_mult
            if wd:
                g = g + wd * p.val
            st = self.state.setdefault(p.name, {})
            if self.name == "adagrad":
                h = st.setdefault("sum_sq", torch.zeros_like(p.val))
                h.addcmul_(g, g)
                p.val.addcdiv_(g, h.sqrt().add_(self.eps), value=-lr)
            else:  # adam (Kingma & Ba), bias-corrected
                m = st.setdefault("m", torch.zeros_like(p.val))
                v = st.setdefault("v", torch.zeros_like(p.val))
                t = st["t"] = st.get("t", 0) + 1
                m.mul_(self.beta1).add_(g, alpha=1 - self.beta1)
                v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
                denom = (v / (1 - self.beta2 ** t)).sqrt_().add_(self.eps)
                p.val.addcdiv_(m, denom, value=-lr / (1 - self.beta1 ** t))

    def _sgd(self, params: list[Param], base_lr: float) -> None:
        """SGD over groups of params sharing (lr, wd), with torch's multi-tensor (foreach)
        kernels: one kernel launch per operation per group instead of one per parameter."""
        groups: dict[tuple[float, float], list[Param]] = {}
        for p in params:
            lr = base_lr * p.lr_mult
            if lr != 0.0:
                groups.setdefault((lr, self.weight_decay * p.wd_mult), []).append(p)
        for (lr, wd), ps in groups.items():
            vals = [p.val for p in ps]
            grads = [p.grad for p in ps]
            if wd:
                grads = torch._foreach_add(grads, vals, alpha=wd)
            if not self.momentum:
                torch._foreach_add_(vals, grads, alpha=-lr)
                continue
            bufs = [self.state.get(p.name, {}).get("momentum") for p in ps]
            if any(b is None for b in bufs):
                # Caffe/SINGA form: v = m v + lr g; w -= v (equal to torch's for a fixed lr)
                bufs = torch._foreach_mul(grads, lr)
                for p, b in zip(ps, bufs):
                    self.state.setdefault(p.name, {})["momentum"] = b
            else:
                torch._foreach_mul_(bufs, self.momentum)
                torch._foreach_add_(bufs, grads, alpha=lr)
            torch._foreach_sub_(vals, bufs)
