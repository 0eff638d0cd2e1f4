"""A stream's Ray Train worker (``train_loop``): it reads its batches from the feeder's queues
(feeder.py), which deal one streaming pipeline (decode once, every feature) for all epochs; at
each end-of-epoch mark rank 0 hands the stream's state to the driver (which scores it on the
validation segments while training goes on) and every rank reports a checkpoint.  The ranks agree
on where an epoch ends with the helpers below, so no rank waits on a collective the others left."""
from __future__ import annotations

import io
import os
import queue as local_queue
import threading
import time

import numpy as np

from orchard.api import Diverged, divergence


def train_loop(config: dict) -> None:
    """Every epoch of one stream on one Ray Train worker (the model never sees the strategy).

    A worker that sees its stream diverge (a NaN or infinite loss, or weights at an epoch's end:
    ``orchard.run.divergence``) hands ``{"stream", "diverged"}`` to the driver, which ends the run
    (``_diverged``), and returns: no checkpoint of it, and no retries of Ray Train."""
    from ray.exceptions import RayActorError

    try:
        _train(config)
    except Diverged as err:
        try:
            config["results"].put({"stream": config["stream"], "diverged": err.fields()})
        except RayActorError:
            return   # the driver already stopped the run and shut its queues down


def _train(config: dict) -> None:
    from orchard.api import worker

    env = worker.env(config)
    # every world_size-th queue of the stream: one per worker, but a group that shrank after a
    # lost node (elastic: strategy.min_workers) reads the queues of the workers it lacks too, so
    # the stream's global batch and the feeder's dealing do not change with the group's size.
    # Read ahead from here: the first batch crosses while the model is built
    mine = [ReadAhead(q) for q in config["queues"][env.rank::env.world_size]]
    try:
        _epochs(config, env, mine)
    finally:
        for queue in mine:   # no get left waiting on a queue actor when the worker ends
            queue.close()


def _epochs(config: dict, env, mine: list) -> None:
    """Every epoch of the stream on this worker, its batches from ``mine`` (its queues, read ahead)."""
    import torch
    from ray.exceptions import RayActorError
    from torch import nn

    from orchard.api import worker

    from .feeder import END, RESIZE, STOP
    from .model import build_stream_model

    # [1] build the model; a group Ray Train restarted resumes after its own last checkpointed
    #     epoch; else a resumed run (python -m orchard resume) starts from the driver's video
    #     checkpoint (checkpoint.py), handed over in the loop config: no file to open here
    torch.manual_seed(config["seed"] + env.rank)
    model = build_stream_model(config["in_channels"], config["num_classes"], config["widths"],
                               config["dropout"])
    replica = worker.replica(model, config["optimizer"], config)
    first_epoch, step = int(config.get("first_epoch", 0)), int(config.get("first_step", 0))
    restored = worker.load_checkpoint()
    if restored is not None:
        replica.load_state_dict(restored[0])
        first_epoch = restored[1] + 1
        step = int(restored[0].get("stream_steps", step))  # per-step metrics go on from there
    elif config.get("state") is not None:
        replica.load_state_dict(torch.load(io.BytesIO(config["state"]), weights_only=True))
    stream, ctx = config["stream"], config["ctx"]
    results = config["results"]
    if env.rank == 0 and restored is None:
        # the priority the trainers train at (strategy.worker_niceness over Ray's workers' own):
        # the run records that they yield the CPU to the pipeline
        ctx.set_tags({f"orchard.{stream}_trainer_nice": os.nice(0) if hasattr(os, "nice") else 0})
    loss_fn = nn.CrossEntropyLoss()
    advice = {"key": "video.optimizer.lr", "value": float(config["optimizer"]["lr"])}

    epoch = first_epoch
    while epoch < config["epochs"]:
        replica.model.train()
        seen = correct = 0
        loss_sum = wait_s = 0.0
        t0 = time.perf_counter()
        going = dict(enumerate(mine))   # this worker's queues whose epoch has not ended yet
        ended: dict[int, int] = {}      # queue -> the epoch its end-of-epoch mark closed
        while True:
            # [2] this worker's part of the next global batch, one item from each of its
            #     queues; the time spent waiting for it is the trainer's view of starvation
            t_wait = time.perf_counter()
            parts = []
            for i, queue in list(going.items()):
                try:
                    item = queue.get(block=True)
                except RayActorError:
                    # the driver shut the queues down: the run was interrupted or failed there.
                    # Ending here (not raising) spares Train its retries, so Ctrl-C ends at once
                    return
                if isinstance(item, tuple) and item[0] in (STOP, RESIZE):
                    # STOP: the run met its target, the driver already has the state it validated;
                    # RESIZE: the driver relaunches this stream with another worker count from the
                    # state of the epoch just finished (its checkpoint)
                    return
                if isinstance(item, tuple) and item[0] == END:
                    ended[i] = int(item[1])
                    del going[i]
                    continue
                parts.append(item)
            wait_s += time.perf_counter() - t_wait
            if not _every_rank_has(bool(parts), env.world_size):
                # the epoch ends for all ranks at once (DDP steps together): a rank whose queues
                # are a batch ahead of another's (one taken by a worker lost in the restart) drops
                # what is left of its epoch
                closed = _drain_to_end(going)
                if closed is None:
                    return
                ended |= closed
                break
            x = torch.tensor(np.concatenate([p["x"] for p in parts])).to(env.device)   # a copy: read-only arrays
            y = torch.tensor(np.concatenate([p["y"] for p in parts]), dtype=torch.long).to(env.device)
            # [3] forward, backward, all-reduce (DDP), step
            logits = replica.model(x)
            loss = loss_fn(logits, y)
            replica.zero_grad()
            loss.backward()
            replica.step()
            # [4] per-stream metrics
            seen += len(y)
            correct += int((logits.argmax(1) == y).sum())
            value = loss.item()
            loss_sum += value * len(y)
            step += 1
            divergence.check({f"{stream} loss": value}, epoch=epoch + 1, step=step, **advice)
            if env.rank == 0:
                ctx.log_metrics({f"train/{stream}_loss": value}, step=step)
        # the feeder's count of the epoch wins. A group restarted (a lost node, an elastic
        # resize) while one queue had passed its end-of-epoch mark and another had not finds its
        # queues an epoch apart: every queue of every rank goes on to the latest mark any of them
        # reached (dropping the batches between), and the state after this pass is handed over
        # for each epoch from the one the group began with to that one, so the driver, which
        # validates epoch by epoch, misses none
        last = _close_epoch(mine, ended, env.world_size)
        if last is None:
            return
        handed, epoch = range(min(epoch, last), last + 1), last
        elapsed = time.perf_counter() - t0
        totals = torch.tensor([seen, correct, loss_sum, wait_s / max(elapsed, 1e-9)], dtype=torch.float64)
        if env.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(totals)
        seen_all, correct_all, loss_all, wait_sum = totals.tolist()
        metrics = {f"train/{stream}_epoch_loss": loss_all / max(seen_all, 1),
                   f"pipeline/{stream}_trainer_wait_fraction": wait_sum / env.world_size,
                   f"train/{stream}_top1": correct_all / max(seen_all, 1),
                   f"throughput/{stream}_clips_per_s": seen_all / max(elapsed, 1e-9),
                   # the group that trained the epoch (elastic groups shrink after a lost node)
                   f"train/{stream}_workers": float(env.world_size)}
        # [5] rank 0 hands the epoch's state to the driver; every rank reports a checkpoint (of
        #     finite weights only: the last update of the epoch may have left them NaN)
        divergence.check_weights(replica.module.parameters(), epoch=epoch + 1, step=step, **advice)
        state = replica.state_dict()
        if env.rank == 0:
            ctx.log_metrics(metrics, step=epoch)
            buf = io.BytesIO()
            torch.save(state, buf)
            try:
                for each in handed:
                    results.put({"stream": stream, "epoch": each, "state": buf.getvalue(), "metrics": metrics,
                                 "steps": step})
            except RayActorError:
                return   # as above: the driver stopped the run and shut its queues down
        worker.save_checkpoint({**state, "stream_steps": step}, {**metrics, "steps": step}, epoch)
        epoch += 1


class ReadAhead:
    """One of the worker's queues, read one batch ahead by a thread: the next batch crosses from
    the queue actor while this one trains. A get from a Ray queue is an actor round trip, which
    the loop paid at every step, and that was most of what the trainers waited for on a pipeline
    that kept up (issue 51). One batch ahead, no more: a worker lost with its node takes at most
    one batch beyond the one it was training on (the group's restart drops those; see
    ``_close_epoch``). The thread ends after a stop or resize mark (nothing after one is this
    worker's), when the queue is gone, or at ``close``; whatever a get raised is raised to the
    loop, at every get. Its gets wait ``POLL_S`` at a time, so ``close`` leaves no call pending
    on the queue actor: a worker whose thread still waited on one took seconds longer to end
    (measured: +5-6 s on a two-epoch video run)."""

    POLL_S = 0.25

    def __init__(self, queue):
        self._items: local_queue.SimpleQueue = local_queue.SimpleQueue()
        self._room = threading.Semaphore(1)   # taken per batch fetched, given back per batch read
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(queue,), daemon=True, name="read-ahead")
        self._thread.start()

    def _read(self, queue) -> None:
        from ray.util.queue import Empty

        from .feeder import RESIZE, STOP

        while not self._closed.is_set():
            if not self._room.acquire(timeout=self.POLL_S):
                continue
            item = Empty
            while item is Empty and not self._closed.is_set():
                try:
                    item = queue.get(block=True, timeout=self.POLL_S)
                except Empty:
                    continue
                except BaseException as err:   # noqa: BLE001 - handed to the loop, which decides
                    self._items.put(err)
                    return
            if item is Empty:
                return
            self._items.put(item)
            if isinstance(item, tuple) and item[0] in (STOP, RESIZE):
                return

    def close(self) -> None:
        """Stop reading (the worker is done with this queue); returns once the thread has."""
        self._closed.set()
        self._thread.join(timeout=10 * self.POLL_S)

    def get(self, block: bool = True):
        item = self._items.get()
        if isinstance(item, BaseException):
            self._items.put(item)   # the queue is gone for every later get too
            raise item
        self._room.release()
        return item


def _every_rank_has(have: bool, world_size: int) -> bool:
    """Whether every rank of the group has a batch for the next step (one rank alone: ``have``)."""
    if world_size == 1:
        return have
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if have else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _close_epoch(mine: list, ended: dict[int, int], world_size: int) -> int | None:
    """The epoch this pass closes: the latest any queue of any rank saw end (``ended``: index in
    ``mine`` -> the epoch its mark closed), after reading the queues that are behind it up to its
    mark; None when the run stopped meanwhile."""
    last = _agree_on_latest(max(ended.values()), world_size)
    behind = {i: mine[i] for i, e in ended.items() if e < last}
    if behind and _drain_to_end(behind, until=last) is None:
        return None
    return last


def _agree_on_latest(epoch: int, world_size: int) -> int:
    """The latest epoch any rank of the group saw end (one rank alone: ``epoch``)."""
    if world_size == 1:
        return epoch
    import torch
    import torch.distributed as dist

    latest = torch.tensor([epoch], dtype=torch.int64)
    dist.all_reduce(latest, op=dist.ReduceOp.MAX)
    return int(latest.item())


def _drain_to_end(queues, until: int | None = None) -> dict[int, int] | None:
    """Read ``queues`` (a list, or index -> queue) up to their end-of-epoch marks, dropping the
    batches; with ``until``, up to the mark that closes that epoch. Returns index -> the epoch
    its last mark closed, or None when the run stopped meanwhile (a stop or resize mark, or the
    queues shut down)."""
    from ray.exceptions import RayActorError

    from .feeder import END

    closed = {}
    for i, queue in (queues.items() if isinstance(queues, dict) else enumerate(queues)):
        while True:
            try:
                item = queue.get(block=True)
            except RayActorError:
                return None
            if isinstance(item, tuple):
                if item[0] != END:
                    return None
                closed[i] = int(item[1])
                if until is None or closed[i] >= until:
                    break
    return closed
