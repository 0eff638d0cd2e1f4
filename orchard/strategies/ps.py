"""Parameter servers on Ray actors, shared by the flower and singa workloads.

Parameters (a ``{name: ndarray}`` dict) are sharded over ``num_servers`` actors by size; each
shard holds its slice of the parameters and the optimizer state and applies updates.  A worker
pushes its gradients and pulls fresh parameters in ONE call per shard (GROUND.md: a separate
push and pull doubles the round trips), with all shards called in parallel.

``mode="sync"``: a shard waits until every worker pushed its gradient for a step, applies the
average once (so the learning rate does not grow with the worker count), then answers all of
them with the same fresh parameters: synchronous replicas.  ``mode="async"``: every push is
applied at once and answered with the shard's current parameters: Downpour SGD.
"""
from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import ray

from orchard.strategies.optimizers import NumpyOptimizer


def assign_shards(sizes: dict[str, int], num_servers: int) -> dict[str, int]:
    """Deterministic size-balanced assignment: largest tensors first onto the lightest server."""
    load = [0] * num_servers
    out = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        server = min(range(num_servers), key=lambda s: (load[s], s))
        out[name] = server
        load[server] += sizes[name]
    return out


@ray.remote(num_cpus=0)
class ParameterServer:
    """One shard: parameters, optimizer state, and the sync barrier for its slice."""

    def __init__(self, num_workers: int, mode: str, optimizer: dict, sync_timeout_s: float = 600.0):
        self.num_workers, self.mode, self.timeout = num_workers, mode, sync_timeout_s
        self.params: dict[str, np.ndarray] | None = None
        self.opt = NumpyOptimizer(optimizer)
        self.pending: dict[int, list] = {}
        self.done: dict[int, asyncio.Event] = {}
        self.updates = 0
        self.bytes_in = 0
        self.bytes_out = 0

    async def initialize(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """First caller sets the parameters; every caller gets the same values back."""
        if self.params is None:
            self.params = {k: np.array(v, dtype=np.float32, copy=True) for k, v in params.items()}
        return self.params

    async def push_pull(self, grads: dict[str, np.ndarray], worker: int, step: int,
                        only_pushed: bool = False) -> dict[str, np.ndarray]:
        """Apply ``grads`` (see the module doc for sync/async) and answer fresh parameters:
        the whole shard, or with ``only_pushed`` just the pushed ones (parameter sampling)."""
        self.bytes_in += sum(g.nbytes for g in grads.values())
        if self.mode == "async":
            self._apply(grads, 1)
        else:
            bucket = self.pending.setdefault(step, [])
            event = self.done.setdefault(step, asyncio.Event())
            bucket.append(grads)
            if len(bucket) == self.num_workers:
                total = {k: sum(g[k] for g in bucket) for k in bucket[0]}
                self._apply(total, self.num_workers)
                del self.pending[step]
                event.set()
            else:
                await asyncio.wait_for(event.wait(), self.timeout)
            if event.is_set() and step in self.done and not self.pending.get(step):
                # Keep a few finished events so late readers of this step still pass.
                for old in [s for s in self.done if s < step - 4]:
                    del self.done[old]
        answer = {k: self.params[k] for k in grads} if only_pushed else self.params
        self.bytes_out += sum(p.nbytes for p in answer.values())
        return answer

    def _apply(self, grads: dict[str, np.ndarray], count: int) -> None:
        # Updates build new arrays (never in place): answers already handed out stay valid.
        self.params = self.opt.apply(self.params, {k: np.asarray(g, np.float32) / count for k, g in grads.items()})
        self.updates += 1

    async def pull(self) -> dict[str, np.ndarray]:
        return self.params

    async def state(self) -> dict:
        return {"params": self.params, "opt": self.opt.state_dict(), "updates": self.updates}

    async def load_state(self, state: dict) -> None:
        """Restore from a checkpoint; drops half-finished sync steps of a crashed generation."""
        self.params = {k: np.array(v, np.float32, copy=True) for k, v in state["params"].items()}
        self.opt.load_state_dict(state["opt"])
        self.updates = int(state.get("updates", 0))
        self.pending.clear()
        for event in self.done.values():
            event.set()
        self.done.clear()

    async def stats(self) -> dict:
        return {"bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "updates": self.updates}


class PSGroup:
    """Driver-side handle of the server shards; picklable, so it travels to workers."""

    def __init__(self, servers: list, num_workers: int, mode: str):
        self.servers, self.num_workers, self.mode = servers, num_workers, mode
        self.assignment: dict[str, int] | None = None

    @classmethod
    def create(cls, params: dict[str, np.ndarray] | None = None, num_servers: int = 1, num_workers: int = 1,
               mode: str = "sync", optimizer: dict | None = None, cpus_per_server: float = 0) -> "PSGroup":
        """Start ``num_servers`` shard actors; with ``params`` they are initialized at once."""
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, got {mode!r}")
        optimizer = optimizer or {"name": "sgd", "lr": 0.01}
        servers = [ParameterServer.options(num_cpus=cpus_per_server).remote(num_workers, mode, optimizer)
                   for _ in range(num_servers)]
        group = cls(servers, num_workers, mode)
        if params is not None:
            group.initialize(params)
        return group

    def _assign(self, params: dict[str, np.ndarray]) -> dict[str, int]:
        if self.assignment is None:
            self.assignment = assign_shards({k: int(np.prod(v.shape)) for k, v in params.items()}, len(self.servers))
        return self.assignment

    def split(self, tensors: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        parts: list[dict] = [{} for _ in self.servers]
        for name, value in tensors.items():
            parts[self.assignment[name]][name] = value
        return parts

    def initialize(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._assign(params)
        refs = [s.initialize.remote(p) for s, p in zip(self.servers, self.split(params))]
        return _merge(ray.get(refs))

    def state(self) -> dict:
        return {"shards": ray.get([s.state.remote() for s in self.servers])}

    def load_state(self, state: dict) -> None:
        ray.get([s.load_state.remote(sh) for s, sh in zip(self.servers, state["shards"])])

    def stats(self) -> dict:
        per = ray.get([s.stats.remote() for s in self.servers])
        return {k: sum(p[k] for p in per) for k in per[0]}

    def shutdown(self) -> None:
        for s in self.servers:
            ray.kill(s)


class PSClient:
    """Worker-side client: fused push+pull to all shards in parallel."""

    def __init__(self, group: PSGroup, worker: int):
        self.group, self.worker = group, worker
        self.wait_s = 0.0

    def initialize(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.group.initialize(params)

    def push_pull(self, grads: dict[str, np.ndarray], step: int, only_pushed: bool = False) -> dict[str, np.ndarray]:
        """Send gradients, get fresh parameters back (read-only arrays: copy before in-place use).

        ``only_pushed=True`` answers just the parameters that were pushed, so a worker that
        samples a fraction of its parameters (SINGA 6.5.1) also downloads only that fraction."""
        t0 = time.perf_counter()
        g = self.group
        g._assign(grads)
        refs = [s.push_pull.remote(p, self.worker, step, only_pushed) for s, p in zip(g.servers, g.split(grads)) if p]
        fresh = _merge(ray.get(refs))
        self.wait_s += time.perf_counter() - t0
        return fresh

    def pull(self) -> dict[str, np.ndarray]:
        return _merge(ray.get([s.pull.remote() for s in self.group.servers]))


def _merge(parts: list[dict]) -> dict:
    out: dict = {}
    for p in parts:
        out.update(p or {})
    return out


def payload_bytes(tensors: dict[str, np.ndarray]) -> int:
    return int(sum(v.nbytes for v in tensors.values()))


def sampled_names(names: list[str], fraction: float, step: int, worker: int) -> list[str]:
    """The subset of parameters a worker exchanges at ``step`` when sampling (SINGA 6.5.1):
    a rotating window, so every parameter is exchanged every ``1/fraction`` steps."""
    if fraction >= 1.0:
        return list(names)
    k = max(1, math.ceil(len(names) * fraction))
    start = ((step + worker) * k) % len(names)
    return [names[(start + i) % len(names)] for i in range(k)]
