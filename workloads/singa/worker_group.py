"""One worker group (5.1): a complete model (partitioned inside the group by ``partition.py``),
its share of the training data, and its BP/CD step.  Runs in a Ray actor or in-process; the
architectures in ``architectures.py`` decide where its gradients go.

``spec`` (a plain dict built by ``train.group_spec``): ``layers``, ``data``, ``data_dir``,
``seed``, ``smoke``, ``batch_size``, ``updater``, ``augment``, ``shuffle``, ``group_size``,
``partition``, ``threads``, ``algorithm`` (bp | cd), ``cd_k``, ``layer_modules`` (the user's
layer packages, imported here so this process knows their types), ``push_every``, ``sample_seed``.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from orchard.api import non_finite

from .apps.augment import deform
from .data import load_dataset
from .layers.base import import_layer_modules
from .model import NeuralNet
from .partition import partition_net
from .updaters import learning_rate, Updater


class WorkerGroup:
    def __init__(self, spec: dict, rank: int = 0, num_groups: int = 1, dataset=None):
        self.spec, self.rank, self.num_groups = spec, rank, num_groups
        torch.set_num_threads(int(spec.get("threads", 1)))
        import_layer_modules(spec.get("layer_modules"))
        full = dataset if dataset is not None else load_dataset(spec["data"], spec.get("data_dir"),
                                                                spec["seed"], spec["smoke"], spec.get("max_input_mb"))
        self.meta = full.meta
        self.data = full.shard(rank, num_groups)
        self.train = {k: torch.as_tensor(v) for k, v in self.data.train.items()}
        self.test = {k: torch.as_tensor(v) for k, v in self.data.test.items()}
        # Same seed in every group: all replicas start from the same parameters.
        base = NeuralNet(spec["layers"], full.shapes(), seed=spec["seed"])
        self.net = partition_net(base, int(spec.get("group_size", 1)), spec.get("partition", "none"),
                                 int(spec["batch_size"]))
        self.partitioned = self.net is not base
        # A partitioned group's K nodes run as Ray actors; this process keeps the master params.
        self.nodes = None
        if self.partitioned:
            from .group_nodes import NodeGroup

            recipe = {"layers": spec["layers"], "input_shapes": full.shapes(), "seed": spec["seed"],
                      "group_size": self.net.group_size, "plan": self.net.plan,
                      "layer_modules": list(spec.get("layer_modules") or [])}
            self.nodes = NodeGroup(self.net, recipe, int(spec.get("threads", 1)))
        if spec.get("initial_params"):
            # e.g. RBM weights from CD pre-training for the BP fine-tune (DBN, Table 1 hybrid)
            self.net.set_params(spec["initial_params"], strict=False)
        self.updater = Updater(spec["updater"])
        self.batch_size = int(spec["batch_size"])
        self.num_train = len(next(iter(self.train.values())))
        self.steps_per_epoch = max(1, self.num_train // self.batch_size)
        self.generator = torch.Generator().manual_seed(spec["seed"] * 1000 + rank)
        self.step = 0
        self._order = None
        self._compute_s = 0.0
        # (step, metric, value) of the first step whose loss metrics were NaN or inf (1-based,
        # this group's count): the driver stops the run there (orchard/run/divergence.py)
        self.first_non_finite: tuple[int, str, float] | None = None

    # -- data -------------------------------------------------------------------------------
    def next_batch(self) -> dict[str, torch.Tensor]:
        """The next mini-batch of this group's shard (reshuffled each epoch unless shuffle=False)."""
        pos = (self.step % self.steps_per_epoch) * self.batch_size
        if pos == 0 or self._order is None:
            self._order = (torch.randperm(self.num_train, generator=self.generator) if self.spec.get("shuffle", True)
                           else torch.arange(self.num_train))
        idx = self._order[pos:pos + self.batch_size]
        batch = {k: v[idx] for k, v in self.train.items()}
        aug = self.spec.get("augment")
        if aug:
            field = aug.get("field", "pixel")
            batch[field] = deform(batch[field], tuple(self.meta["image_hw"]), self.generator,
                                  aug.get("rotate_deg", 10.0), aug.get("scale", 0.08), aug.get("shift_px", 0.6))
        return batch

    # -- one step -------------------------------------------------------------------------------
    def compute(self) -> dict[str, float]:
        """BP (or CD-k) on the next batch: fills the params' gradients; returns loss metrics."""
        t0 = time.perf_counter()
        batch = self.next_batch()
        algorithm, cd_k = self.spec.get("algorithm", "bp"), int(self.spec.get("cd_k", 1))
        if self.nodes is not None:
            metrics = self.nodes.run(algorithm, batch, cd_k)
        elif algorithm == "cd":
            metrics = self.net.train_cd(batch, cd_k)
        else:
            metrics = self.net.train_bp(batch)
        self._compute_s += time.perf_counter() - t0
        if self.first_non_finite is None:
            bad = non_finite(metrics)
            if bad is not None:
                self.first_non_finite = (self.step + 1, *bad)
        return metrics

    def local_step(self) -> dict[str, float]:
        """compute + a local update (single group, or all-reduced gradients already in place)."""
        metrics = self.compute()
        self.apply_update()
        return metrics

    def apply_update(self, grads: dict[str, np.ndarray] | None = None) -> None:
        """Apply the updater to this group's params, with its own gradients or with ``grads``
        (unpartitioned names, e.g. all-reduced ones)."""
        if not self.partitioned:
            if grads is not None:
                for p in self.net.params:
                    p.grad = torch.as_tensor(grads[p.name])
            self.updater.update(self.net.params, self.step)
        else:
            # Update in unpartitioned names so data replicas inside the group stay identical.
            master = _MasterParams(self.net.get_params(), grads or self.net.get_grads(), self.net)
            self.updater.update(master.params, self.step)
            self.net.set_params({p.name: p.val.numpy() for p in master.params})
        self.step += 1

    def server_gradients(self, weight_decay: float = 0.0) -> dict[str, np.ndarray]:
        """Gradients to push: ``lr_mult * lr(step)/lr * (g + weight_decay * wd_mult * w)``, so
        servers with a fixed base lr and no decay of their own apply SINGA's per-param, per-step
        learning rate and per-param weight decay (exact for SGD, as the local updater does)."""
        scale = learning_rate(self.spec["updater"], self.step) / float(self.spec["updater"].get("lr", 0.01))
        grads = self.net.get_grads()
        mults = {p.name: (p.lr_mult, p.wd_mult) for p in self.net.params}
        values = self.net.get_params() if weight_decay else {}
        out = {}
        for n, g in grads.items():
            lr_mult, wd_mult = mults.get(n, (1.0, 1.0))
            if lr_mult == 0.0:
                continue  # frozen (e.g. lower RBMs of a DBN stage): not pushed, so never decayed
            if weight_decay and wd_mult:
                g = g + (weight_decay * wd_mult) * values[n]
            out[n] = (g * (lr_mult * scale)).astype(np.float32, copy=False)
        return out

    def set_params(self, values: dict[str, np.ndarray]) -> None:
        self.net.set_params(values)

    def get_params(self) -> dict[str, np.ndarray]:
        return self.net.get_params()

    def advance(self) -> None:
        self.step += 1

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, batch_size: int = 500) -> dict[str, float]:
        """Test-set metrics averaged over batches (loss-layer metrics, e.g. ``loss/accuracy``)."""
        n = len(next(iter(self.test.values())))
        totals: dict[str, float] = {}
        for i in range(0, n, batch_size):
            batch = {k: v[i:i + batch_size] for k, v in self.test.items()}
            metrics = self.nodes.run("test", batch) if self.nodes else self.net.forward(batch, "test")
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v * len(next(iter(batch.values())))
        return {k: v / n for k, v in totals.items()}

    def stats(self) -> dict[str, float]:
        """``bridge_bytes``: bytes the group's bridge layers sent between its node actors in
        training steps; ``group_param_bytes``: parameter pieces out to them + gradients back."""
        return {"compute_s": self._compute_s, "steps": self.step,
                "bridge_bytes": self.nodes.bridge_bytes if self.nodes else 0,
                "group_param_bytes": self.nodes.param_bytes if self.nodes else 0,
                "num_train": self.num_train}

    def close(self) -> None:
        """Stop the node actors of a partitioned group (a GroupActor's own end stops them too)."""
        if self.nodes is not None:
            self.nodes.close()

    def plan(self) -> dict[str, str]:
        return self.net.describe_plan() if self.partitioned else {}


class _MasterParams:
    """Unpartitioned ``Param``-like views used to update a partitioned net in one place."""

    def __init__(self, values, grads, net):
        from types import SimpleNamespace

        mults = {}
        for name, entries in net._param_map.items():
            mults[name] = (entries[0][0].lr_mult, entries[0][0].wd_mult)
        self.params = [SimpleNamespace(name=n, val=torch.as_tensor(v), grad=torch.as_tensor(grads[n]),
                                       lr_mult=mults[n][0], wd_mult=mults[n][1]) for n, v in values.items()]
