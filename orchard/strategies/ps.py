"""Parameter servers on Ray actors, shared by the flower and singa workloads.

Parameters (a ``{name: ndarray}`` dict) are sharded over ``num_servers`` actors by size; each
shard holds its slice of the parameters and the optimizer state and applies updates.  A worker
pushes its gradients and pulls fresh parameters in ONE call per shard (GROUND.md: a separate
push and pull doubles the round trips), with all shards called in parallel.

On the wire each shard's tensors travel as ONE contiguous float32 vector in the shard's fixed
layout order (``ShardLayout``), not as a dict of arrays: one buffer serializes, crosses the
object store and sums faster than dozens of small ones, and the optimizer updates the whole
shard in one vectorized step (per-tensor slices only when workers sample parameters).

Up to ``INLINE_MAX_BYTES`` that vector crosses in pieces small enough for Ray to carry inside
the call and its reply (``wire_pieces``), not through the object stores: a worker on another
node than its shard then pays what a worker beside it pays (a 0.6 MB push and pull across two
nodes: about half the time of one array; on one node within a few percent: ``python -m bench ps_wire``,
docs/scaling.md). The caller says how many pieces it wants back (``num_returns``).

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

from orchard.cluster.actors import kill_and_confirm
from orchard.strategies.optimizers import NumpyOptimizer


# Ray carries a call's argument or return value inline when it is below max_direct_call_object_size
# (100 KiB by default; a piece leaves room for its pickle header), and up to task_rpc_inlined_bytes_limit
# (10 MiB) of them in one call. A bigger shard goes through the object store as one array, where
# bandwidth, not the round trip, is its cost.
INLINE_PIECE_BYTES = 96_000
INLINE_MAX_BYTES = 8 << 20


def wire_pieces(count: int) -> int:
    """Into how many pieces a float32 vector of ``count`` values is cut for the wire (1: whole)."""
    nbytes = 4 * count
    return 1 if nbytes > INLINE_MAX_BYTES else max(1, math.ceil(nbytes / INLINE_PIECE_BYTES))


def assign_shards(sizes: dict[str, int], num_servers: int) -> dict[str, int]:
    """Deterministic size-balanced assignment: largest tensors first onto the lightest server."""
    load = [0] * num_servers
    out = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        server = min(range(num_servers), key=lambda s: (load[s], s))
        out[name] = server
        load[server] += sizes[name]
    return out


class ShardLayout:
    """Where each tensor of a shard lives inside the shard's flat vector."""

    def __init__(self, shapes: dict[str, tuple]):
        # Sorted, so a client and a server agree whatever order their dicts came in.
        self.names = sorted(shapes)
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self.offsets, total = {}, 0
        for name in self.names:
            size = int(np.prod(self.shapes[name], dtype=np.int64))
            self.offsets[name] = (total, total + size)
            total += size
        self.size = total

    def pack(self, tensors: dict[str, np.ndarray], names: list[str] | None = None) -> np.ndarray:
        """``tensors[names]`` (default: all, in layout order) as one float32 vector."""
        return np.concatenate([np.asarray(tensors[n], np.float32).ravel() for n in (names or self.names)])

    def unpack(self, flat: np.ndarray, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Views into ``flat`` (no copy), shaped like the tensors ``names`` were packed from."""
        out, start = {}, 0
        for name in names or self.names:
            lo, hi = self.offsets[name]
            out[name] = flat[start:start + hi - lo].reshape(self.shapes[name])
            start += hi - lo
        return out


@ray.remote(num_cpus=0)
class ParameterServer:
    """One shard: parameters, optimizer state, and the sync barrier for its slice."""

    def __init__(self, num_workers: int, mode: str, optimizer: dict, sync_timeout_s: float = 600.0,
                 async_average: bool = False):
        self.num_workers, self.mode, self.timeout = num_workers, mode, sync_timeout_s
        # async_average: each push moves the parameters 1/num_workers as far (the learning rate
        # is scaled, so it holds for scale-free rules such as Adam too): a round of pushes then
        # moves them as far as one sync step, and the rate does not grow with the worker count.
        self.async_average = bool(async_average and mode == "async")
        self.async_lr_scale = 1.0 / num_workers if self.async_average else 1.0
        self.params: dict[str, np.ndarray] | None = None
        self.flat: np.ndarray | None = None          # self.params are views into it
        self.layout: ShardLayout | None = None
        self.opt = NumpyOptimizer(optimizer)
        self.slots: dict[str, np.ndarray] = {}       # optimizer state, flat like self.flat
        self.steps: np.ndarray | None = None         # per-tensor update counts (Adam's t)
        self.pending: dict[int, list] = {}
        self.done: dict[int, asyncio.Event] = {}
        self.updates = 0
        self.bytes_in = 0
        self.bytes_out = 0

    async def begin(self, num_workers: int) -> bool:
        """A worker group (re)started with ``num_workers`` workers: half-finished sync steps of
        the group before it are dropped (their pushers are gone), and the barrier counts the
        new group. The parameters stay; a checkpoint restore (load_state) replaces them."""
        self.num_workers = int(num_workers)
        self.async_lr_scale = 1.0 / self.num_workers if self.async_average else 1.0
        self.pending.clear()
        for event in self.done.values():
            event.set()
        self.done.clear()
        return self.params is not None

    async def initialize(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """First caller sets the parameters; every caller gets the same values back."""
        if self.params is None:
            self._set(params)
        return self.params

    def _set(self, params: dict[str, np.ndarray]) -> None:
        self.layout = ShardLayout({k: np.shape(v) for k, v in params.items()})
        self.flat = self.layout.pack(params)
        self.params = self.layout.unpack(self.flat)
        self.slots = self.opt.slots_for(self.layout.size)
        self.steps = np.zeros(len(self.layout.names), np.int64)

    async def push_pull(self, names: tuple | None, worker: int, step: int, only_pushed: bool, answer_pieces: int,
                        *grads: np.ndarray) -> np.ndarray | tuple:
        """Apply the flat gradient of ``names`` (None: the whole shard, in layout order; see the
        module doc for sync/async), sent as ``grads``' pieces, and answer fresh parameters as one
        flat vector in ``answer_pieces`` pieces (the caller's ``num_returns``): the whole shard,
        or with ``only_pushed`` just ``names`` (parameter sampling)."""
        grads = grads[0] if len(grads) == 1 else np.concatenate(grads)
        self.bytes_in += grads.nbytes
        if self.mode == "async":
            self._apply(grads, names, 1)
        else:
            bucket = self.pending.setdefault(step, [])
            event = self.done.setdefault(step, asyncio.Event())
            if bucket and names != bucket[0][1]:
                raise ValueError("ps sync mode needs every worker to push the same parameters at a step "
                                 f"(step {step}: {names} vs {bucket[0][1]}); sample parameters in async mode")
            bucket.append((grads, names))
            if len(bucket) == self.num_workers:
                total = bucket[0][0].copy()
                for g, _ in bucket[1:]:
                    total += g
                self._apply(total, names, self.num_workers)
                del self.pending[step]
                event.set()
            else:
                await asyncio.wait_for(event.wait(), self.timeout)
            if event.is_set() and step in self.done and not self.pending.get(step):
                # Keep a few finished events so late readers of this step still pass.
                for old in [s for s in self.done if s < step - 4]:
                    del self.done[old]
        answer = self.layout.pack(self.params, list(names)) if (only_pushed and names) else self.flat
        self.bytes_out += answer.nbytes
        return answer if answer_pieces == 1 else tuple(np.array_split(answer, answer_pieces))

    def _apply(self, flat_grads: np.ndarray, names: tuple | None, count: int) -> None:
        """One optimizer step on the flat vector; a new vector each time (never in place), so
        answers already handed out stay valid."""
        grads = flat_grads / np.float32(count)
        index = {n: i for i, n in enumerate(self.layout.names)}
        if names is None and (self.steps == self.steps[0]).all():
            # Every tensor at the same step (no sampling): one vectorized update of the shard.
            self.steps += 1
            self.flat = self.opt.update(self.flat, grads, self.slots, int(self.steps[0]), self.async_lr_scale)
        else:
            new, start = self.flat.copy(), 0
            for name in names or self.layout.names:
                lo, hi = self.layout.offsets[name]
                self.steps[index[name]] += 1
                new[lo:hi] = self.opt.update(self.flat[lo:hi], grads[start:start + hi - lo],
                                             {k: v[lo:hi] for k, v in self.slots.items()},
                                             int(self.steps[index[name]]), self.async_lr_scale)
                start += hi - lo
            self.flat = new
        self.params = self.layout.unpack(self.flat)
        self.updates += 1

    async def pull(self) -> dict[str, np.ndarray]:
        return self.params

    async def state(self) -> dict:
        return {"params": self.params, "opt": {"slots": self.slots, "steps": self.steps}, "updates": self.updates}

    async def load_state(self, state: dict) -> None:
        """Restore from a checkpoint; drops half-finished sync steps of a crashed generation."""
        self._set(state["params"])
        self.slots = {k: np.array(v, np.float32).ravel() for k, v in state["opt"]["slots"].items()}
        self.steps = np.array(state["opt"]["steps"], np.int64)
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
        self.layouts: list[ShardLayout] | None = None

    @classmethod
    def create(cls, params: dict[str, np.ndarray] | None = None, num_servers: int = 1, num_workers: int = 1,
               mode: str = "sync", optimizer: dict | None = None, cpus_per_server: float = 0,
               async_average: bool = False) -> "PSGroup":
        """Start ``num_servers`` shard actors; with ``params`` they are initialized at once."""
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, got {mode!r}")
        optimizer = optimizer or {"name": "sgd", "lr": 0.01}
        # A server whose node is lost comes back on another (max_restarts), empty: the workers'
        # group fails with it (calls are not retried), and the group Ray Train restarts fills the
        # servers again from its checkpoint (PSReplica), so no shard of parameters is ever lost.
        options = dict(num_cpus=cpus_per_server, max_restarts=-1, max_task_retries=0)
        if ray.util.get_current_placement_group() is None:
            # shards on different nodes: their traffic shares the links, and a lost node takes
            # one shard, not all. Inside a sweep trial they stay in the trial's placement group.
            options["scheduling_strategy"] = "SPREAD"
        servers = [ParameterServer.options(**options).remote(num_workers, mode, optimizer, async_average=async_average)
                   for _ in range(num_servers)]
        group = cls(servers, num_workers, mode)
        if params is not None:
            group.initialize(params)
        return group

    def _assign(self, params: dict[str, np.ndarray]) -> dict[str, int]:
        if self.assignment is None:
            self.assignment = assign_shards({k: int(np.prod(v.shape)) for k, v in params.items()}, len(self.servers))
            self.layouts = [ShardLayout({k: np.shape(v) for k, v in part.items()}) for part in self.split(params)]
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

    def begin(self, num_workers: int, wait_s: float = 120.0) -> None:
        """Tell every shard a new worker group of ``num_workers`` starts (ParameterServer.begin).
        A shard still coming back from a lost node is waited for, up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                ray.get([s.begin.remote(num_workers) for s in self.servers])
                return
            except ray.exceptions.ActorUnavailableError:  # restarting after its node was lost
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def state(self) -> dict:
        return {"shards": ray.get([s.state.remote() for s in self.servers])}

    def load_state(self, state: dict) -> None:
        ray.get([s.load_state.remote(sh) for s, sh in zip(self.servers, state["shards"])])

    def stats(self) -> dict:
        per = ray.get([s.stats.remote() for s in self.servers])
        return {k: sum(p[k] for p in per) for k in per[0]}

    def shutdown(self) -> None:
        """End the servers for good: they restart after a fault (``max_restarts``), and one
        killed mid-restart can outlive a plain kill, holding its CPUs."""
        kill_and_confirm(self.servers)


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
        calls = []
        for server, layout, part in zip(g.servers, g.layouts, g.split(grads)):
            if not part:
                continue
            # The common case (every tensor of the shard) sends no names: layout order is known.
            names = None if len(part) == len(layout.names) else tuple(n for n in layout.names if n in part)
            flat = layout.pack(part, list(names) if names else None)
            answered = list(names) if (names and only_pushed) else None
            back = flat.size if answered else layout.size
            pieces = wire_pieces(back)
            refs = server.push_pull.options(num_returns=pieces).remote(
                names, self.worker, step, only_pushed, pieces, *np.array_split(flat, wire_pieces(flat.size)))
            calls.append((refs if pieces > 1 else [refs], layout, answered))
        answers = ray.get([ref for refs, _, _ in calls for ref in refs])
        fresh, at = [], 0
        for refs, layout, names in calls:
            got = answers[at:at + len(refs)]
            at += len(refs)
            fresh.append(layout.unpack(got[0] if len(got) == 1 else np.concatenate(got), names))
        fresh = _merge(fresh)
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
