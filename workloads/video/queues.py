"""The trainers' queues: one Ray actor holds every queue of a run.

The feeder (feeder.py) puts each trainer worker's part of a batch in that worker's bounded queue,
and each stream's rank 0 puts its end-of-epoch state in the results queue (train.py). Ray's own
``ray.util.queue.Queue`` is an actor, so a process, per queue: a default run (one spatial and two
temporal workers) started four, ~0.8 s of CPU each, at the moment the decoders, the extractors and
the trainers all start on the same cores (issue 49: the processes around the work). Here one
``QueueHub`` actor holds them all, and ``HubQueue`` is one queue of it with the part of
``ray.util.queue.Queue``'s API the run uses (``put``, ``get``, ``qsize``, ``shutdown``; ``Full``
and ``Empty`` as Ray's queue raises them).

A queue is made where it is first used, with the size its handle carries, so making queues waits
for nothing (the hub starts while the run goes on). The hub lives on the driver's node: a lost
node must not take batches the trainers have not read (node_loss.py). ``shutdown`` drops a queue;
the hub ends with its last queue, and a get waiting on a queue of an ended hub raises
``RayActorError``, which is how a trainer learns that the driver stopped the run.
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Any


class QueueHub:
    """The actor: named asyncio queues, each made on first use with the size its caller gives."""

    def __init__(self):
        self._queues: dict[str, asyncio.Queue] = {}
        self._dropped: set[str] = set()

    def _queue(self, name: str, maxsize: int) -> asyncio.Queue:
        if name in self._dropped:
            raise KeyError(f"queue {name} was shut down")
        if name not in self._queues:
            self._queues[name] = asyncio.Queue(maxsize)
        return self._queues[name]

    async def put(self, name: str, maxsize: int, item: Any, timeout: float | None) -> bool:
        """False: still full after ``timeout`` seconds (None: wait as long as it takes)."""
        try:
            await asyncio.wait_for(self._queue(name, maxsize).put(item), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def put_nowait(self, name: str, maxsize: int, item: Any) -> bool:
        try:
            self._queue(name, maxsize).put_nowait(item)
            return True
        except asyncio.QueueFull:
            return False

    async def get(self, name: str, maxsize: int, timeout: float | None) -> tuple[bool, Any]:
        """(True, item), or (False, None) when still empty after ``timeout`` seconds."""
        try:
            return True, await asyncio.wait_for(self._queue(name, maxsize).get(), timeout)
        except asyncio.TimeoutError:
            return False, None

    async def get_nowait(self, name: str, maxsize: int) -> tuple[bool, Any]:
        try:
            return True, self._queue(name, maxsize).get_nowait()
        except asyncio.QueueEmpty:
            return False, None

    async def qsize(self, name: str, maxsize: int) -> int:
        return self._queue(name, maxsize).qsize()

    async def drop(self, names: list[str]) -> int:
        """Forget ``names``; how many queues are left."""
        for name in names:
            self._queues.pop(name, None)
            self._dropped.add(name)
        return len(self._queues)


def start_hub():
    """A new hub actor on this (the driver's) node, holding no CPU."""
    import ray

    from orchard.api import on_this_node

    return ray.remote(QueueHub).options(num_cpus=0, **on_this_node()).remote()


class HubQueue:
    """One queue of a hub, for any process of the run (it travels in a Train loop's config)."""

    def __init__(self, hub, name: str, maxsize: int = 0):
        self.hub, self.name, self.maxsize = hub, name, int(maxsize)

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        import ray
        from ray.util.queue import Full

        call = self.hub.put.remote(self.name, self.maxsize, item, timeout) if block else \
            self.hub.put_nowait.remote(self.name, self.maxsize, item)
        if not ray.get(call):
            raise Full

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        import ray
        from ray.util.queue import Empty

        call = self.hub.get.remote(self.name, self.maxsize, timeout) if block else \
            self.hub.get_nowait.remote(self.name, self.maxsize)
        found, item = ray.get(call)
        if not found:
            raise Empty
        return item

    def qsize(self) -> int:
        import ray

        return ray.get(self.hub.qsize.remote(self.name, self.maxsize))

    def shutdown(self, force: bool = False) -> None:
        shutdown_queues({"": [self]})


def make_queues(alloc: dict[str, int], depth: int, hub=None) -> dict[str, list[HubQueue]]:
    """One bounded queue per worker of each stream (``depth`` batches each; 0: unbounded), all
    held by ``hub`` (None: a new one)."""
    hub = hub if hub is not None else start_hub()
    return {s: [HubQueue(hub, f"{s}.{i}.{uuid.uuid4().hex[:8]}", depth) for i in range(n)]
            for s, n in alloc.items()}


def shutdown_queues(queues: dict[str, list[HubQueue]]) -> None:
    """Drop the queues; a hub left with none ends (a trainer waiting on it gets RayActorError)."""
    import ray

    by_hub: dict[Any, list[HubQueue]] = {}
    for qs in queues.values():
        for q in qs:
            by_hub.setdefault(q.hub, []).append(q)
    for hub, qs in by_hub.items():
        try:
            if ray.get(hub.drop.remote([q.name for q in qs])) == 0:
                ray.kill(hub)
        except Exception:  # noqa: BLE001 - already gone (its node, or Ray, went first)
            pass
