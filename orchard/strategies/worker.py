"""What a training loop calls on each worker, whatever the strategy.

The model never knows how it is distributed: ``replica(model, optimizer_spec, config)`` wraps
it for the strategy in ``config["strategy"]`` and the loop only calls
``replica.model(x)``, ``replica.zero_grad()``, ``loss.backward()``, ``replica.step()``.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from orchard.strategies.optimizers import torch_optimizer

CHECKPOINT_FILE = "state.pt"


@dataclass
class WorkerEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    def shard(self, items):
        """This worker's equal share of ``items`` (a list or array); the tail that does not
        divide evenly is dropped so every worker takes the same number of steps (ps sync)."""
        per = len(items) // self.world_size
        return items[self.rank * per:(self.rank + 1) * per]


def env(config: dict | None = None) -> WorkerEnv:
    """Rank, world size and device of this worker (a single process outside Ray Train)."""
    try:
        import ray.train

        ctx = ray.train.get_context()
        rank, world, local = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()
        import ray.train.torch

        device = ray.train.torch.get_device()
    except Exception:
        rank, world, local = 0, 1, 0
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return WorkerEnv(rank, world, local, device)


def _params_numpy(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}


class AllReduceTimer:
    """What the ring cost a worker's steps, counted by a DDP communication hook (``timed_allreduce``).

    DDP all-reduces the gradients in buckets while backward still computes the earlier layers;
    the step waits on the network only for what is still in flight once backward has made its
    last bucket. ``wait_s`` is that: from the last bucket's launch until its all-reduce
    completed (gloo completes buckets in order, so it is the step's last), summed over the
    steps. ``grad_bytes`` counts the gradients all-reduced; a ring sends and receives
    2 (N - 1) / N of them each way per worker (``bytes_per_step``)."""

    def __init__(self, world_size: int):
        self.world_size, self.wait_s, self.grad_bytes, self.steps = world_size, 0.0, 0, 0

    def bytes_per_step(self) -> float:
        ring = 2 * (self.world_size - 1) / self.world_size  # each way: a reduce-scatter and an all-gather
        return 2 * ring * self.grad_bytes / max(self.steps, 1)


def timed_allreduce(timer: AllReduceTimer, bucket):
    """DDP's own all-reduce of ``bucket`` (``default_hooks.allreduce_hook``), timed into ``timer``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buffer = bucket.buffer()
    timer.grad_bytes += buffer.numel() * buffer.element_size()
    future = default_hooks.allreduce_hook(None, bucket)
    if not bucket.is_last():
        return future
    launched = time.perf_counter()

    def done(fut):
        timer.wait_s += time.perf_counter() - launched
        timer.steps += 1
        return fut.value()

    return future.then(done)


class RingReplica:
    """DDP all-reduce: gradients are averaged by DDP during backward; the optimizer is local."""

    def __init__(self, model: torch.nn.Module, optimizer: dict, config: dict):
        import ray.train.torch

        self.module = model
        world = env().world_size
        self.model = ray.train.torch.prepare_model(model) if world > 1 else model.to(env().device)
        self.timer = None
        if world > 1 and hasattr(self.model, "register_comm_hook"):  # DDP: time its all-reduce
            self.timer = AllReduceTimer(world)
            self.model.register_comm_hook(self.timer, timed_allreduce)
        self.optimizer = torch_optimizer(optimizer, self.model.parameters())

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.optimizer.step()

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """The checkpoint's weights and optimizer state (momentum, moments), with this run's
        optimizer settings: torch's ``load_state_dict`` would bring back the checkpoint's lr, and
        a resume with a new lr (what a diverged run's line asks for) must train with the new one."""
        self.module.load_state_dict(state["model"])
        configured = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, settings in zip(self.optimizer.param_groups, configured):
            group.update(settings)

    def comm_stats(self) -> dict:
        """The time this worker's steps waited on the all-reduce and the bytes a step moved (none alone)."""
        if self.timer is None:
            return {}
        return {"wire/bytes_per_step": self.timer.bytes_per_step(), "time/comm_wait_s": self.timer.wait_s}


class PSReplica:
    """Parameter servers: gradients go to the servers, fresh parameters come back, in one call."""

    def __init__(self, model: torch.nn.Module, optimizer: dict, config: dict):
        from orchard.strategies.ps import PSClient

        self.env = env()
        self.model = self.module = model.to(self.env.device)
        self.group = config["ps_group"]
        self.client = PSClient(self.group, self.env.rank)
        self.steps = 0
        self.bytes = 0
        # A (re)started group: rank 0 resets the servers' barrier to this group's size before
        # anyone pushes (a group restarted after a lost node may be smaller, and the steps of
        # the group before it never completed).
        if self.env.rank == 0:
            self.group.begin(self.env.world_size)
        _barrier()
        # Every worker starts from the same parameters: the first to arrive sets them (servers
        # that came back empty from a lost node too; a checkpoint then replaces them).
        self._copy_in(self.client.initialize(_params_numpy(model)))

    def _copy_in(self, params: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                p.copy_(torch.from_numpy(np.array(params[name], copy=True)).to(p.device))

    def zero_grad(self) -> None:
        self.module.zero_grad(set_to_none=False)

    def step(self) -> None:
        grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy()
                 for n, p in self.module.named_parameters()}
        fresh = self.client.push_pull(grads, self.steps)
        self.bytes += sum(g.nbytes for g in grads.values()) + sum(v.nbytes for v in fresh.values())
        self._copy_in(fresh)
        self.steps += 1

    def state_dict(self) -> dict:
        shards = self.group.state()["shards"]
        return {"model": self.module.state_dict(), "ps": _to_torch(shards), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.steps = int(state.get("steps", 0))
        if self.env.rank == 0:
            self.group.load_state({"shards": _to_numpy(state["ps"])})
        _barrier()
        self._copy_in(self.client.pull())

    def comm_stats(self) -> dict:
        return {"wire/bytes_per_step": self.bytes / max(self.steps, 1), "time/comm_wait_s": self.client.wait_s}


def replica(model: torch.nn.Module, optimizer: dict, config: dict):
    """Wrap ``model`` for the strategy named in ``config["strategy"]["name"]``.

    ``optimizer`` is a spec such as ``{"name": "sgd", "lr": 0.01, "momentum": 0.9}``: ring
    builds the torch optimizer, ps hands the same rule to the servers.
    """
    name = config["strategy"]["name"]
    if name == "ps":
        return PSReplica(model, optimizer, config)
    return RingReplica(model, optimizer, config)


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(state: dict, metrics: dict, epoch: int) -> None:
    """Report ``metrics`` and, from rank 0, a checkpoint of ``state`` (every rank must call this)."""
    import ray.train

    metrics = {**{k: float(v) for k, v in metrics.items()}, "epoch": epoch}
    if env().rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"state": state, "epoch": epoch}, Path(tmp) / CHECKPOINT_FILE)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))


# set by the launcher in each worker process (launch._wrap): where rank 0 notes that its group
# started and from which epoch (orchard/strategies/node_loss.py), and the run's context
_RECOVERY: dict = {}


def load_checkpoint():
    """``(state, epoch)`` of the latest checkpoint of this run, or ``None`` on a fresh start.

    Every worker group calls this once as it starts, so rank 0 notes here that training goes
    on, and from which epoch: after a lost node, that is when the loss stopped costing time
    (``train/lost_s``, ``train/restarts``; ``train/group_workers`` and ``train/resumed_from_epoch``
    at step = the start's number)."""
    import ray.train

    ckpt = ray.train.get_checkpoint()
    restored = None
    if ckpt is not None:
        with ckpt.as_directory() as folder:
            data = torch.load(Path(folder) / CHECKPOINT_FILE, weights_only=True, map_location="cpu")
        restored = data["state"], int(data["epoch"])
    _note_start(None if restored is None else restored[1])
    return restored


def _note_start(epoch: int | None) -> None:
    log, ctx = _RECOVERY.get("log"), _RECOVERY.get("ctx")
    if log is None or env().rank != 0:
        return
    import time

    starts = log.started(env().world_size, epoch, time.time())
    if ctx is not None:  # each group's size (elastic groups shrink and grow) and where it went on from
        ctx.log_metrics({"train/group_workers": env().world_size,
                         **({"train/resumed_from_epoch": epoch + 1} if epoch is not None else {})}, step=starts)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _to_torch(obj):
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, dict):
        return {k: _to_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_torch(v) for v in obj]
    return obj


def _to_numpy(obj):
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_numpy(v) for v in obj]
    return obj
