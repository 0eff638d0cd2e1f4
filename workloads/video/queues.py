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
node must not take batches the trainers have not read (node_loss.py). ``shutdown`` drops a queue
and the hub ends with its last one. Any call on a dropped queue, waiting when it was dropped or
arriving after, raises ``RayActorError`` as Ray's queue does once its actor is gone: that is how a
trainer learns that the driver stopped the run (stream_worker.py).
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Any


GONE = "gone"   # what the hub answers for a queue that was shut down (the caller raises)


class QueueHub:
    """The actor: named asyncio queues, each made on first use with the size its caller gives.

    Each call answers ``(status, item)``: ``True`` done, ``False`` still full or empty after the
    timeout, or ``GONE`` when the queue was shut down before or while the call waited. A call that
    reaches the hub after ``drop`` (a trainer's read-ahead may be one poll behind) must learn the
    same as one that was waiting, as it would from Ray's queue, whose actor is dead by then."""

    def __init__(self):
        self._queues: dict[str, asyncio.Queue] = {}
        self._closed: dict[str, asyncio.Event] = {}   # set when the queue is dropped
        self._dropped: set[str] = set()

    def _queue(self, name: str, maxsize: int) -> asyncio.Queue | None:
        if name in self._dropped:
            return None
        if name not in self._queues:
            self._queues[name] = asyncio.Queue(maxsize)
            self._closed[name] = asyncio.Event()
        return self._queues[name]

    async def _wait(self, name: str, op, timeout: float | None) -> tuple[Any, Any]:
        """Run ``op`` (a queue's put or get) until it is done, the timeout passes or the queue
        is dropped, whichever comes first."""
        doing = asyncio.ensure_future(op)
        closing = asyncio.ensure_future(self._closed[name].wait())
        done, _ = await asyncio.wait({doing, closing}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in (doing, closing):
            if task not in done:
                task.cancel()
        if doing in done:
            return True, doing.result()
        return (GONE if closing in done else False), None

    async def put(self, name: str, maxsize: int, item: Any, timeout: float | None):
        """(True, None); False: still full after ``timeout`` seconds (None: as long as it takes)."""
        queue = self._queue(name, maxsize)
        return (GONE, None) if queue is None else await self._wait(name, queue.put(item), timeout)

    async def put_nowait(self, name: str, maxsize: int, item: Any):
        queue = self._queue(name, maxsize)
        if queue is None:
            return GONE, None
        try:
            queue.put_nowait(item)
            return True, None
        except asyncio.QueueFull:
            return False, None

    async def get(self, name: str, maxsize: int, timeout: float | None):
        """(True, item), or (False, None) when still empty after ``timeout`` seconds."""
        queue = self._queue(name, maxsize)
        return (GONE, None) if queue is None else await self._wait(name, queue.get(), timeout)

    async def get_nowait(self, name: str, maxsize: int):
        queue = self._queue(name, maxsize)
        if queue is None:
            return GONE, None
        try:
            return True, queue.get_nowait()
        except asyncio.QueueEmpty:
            return False, None

    async def qsize(self, name: str, maxsize: int):
        queue = self._queue(name, maxsize)
        return (GONE, None) if queue is None else (True, queue.qsize())

    async def drop(self, names: list[str]) -> int:
        """Forget ``names`` and wake whatever waits on them; how many queues are left."""
        for name in names:
            self._queues.pop(name, None)
            closed = self._closed.pop(name, None)
            if closed is not None:
                closed.set()
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

    def _answer(self, call, unmet: type[Exception] = Exception) -> Any:
        """The hub's answer to ``call``: its item, ``unmet`` raised when the timeout passed, and
        RayActorError when the queue was shut down, as Ray's queue raises once its actor is gone."""
        import ray
        from ray.exceptions import RayActorError

        status, item = ray.get(call)
        if status == GONE:
            raise RayActorError(error_msg=f"queue {self.name} was shut down")
        if not status:
            raise unmet
        return item

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        from ray.util.queue import Full

        call = self.hub.put.remote(self.name, self.maxsize, item, timeout) if block else \
            self.hub.put_nowait.remote(self.name, self.maxsize, item)
        self._answer(call, Full)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        from ray.util.queue import Empty

        call = self.hub.get.remote(self.name, self.maxsize, timeout) if block else \
            self.hub.get_nowait.remote(self.name, self.maxsize)
        return self._answer(call, Empty)

    def qsize(self) -> int:
        return self._answer(self.hub.qsize.remote(self.name, self.maxsize))   # never unmet

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
