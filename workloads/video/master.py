"""The master: seeded class-balanced segment sampling and the decode control API.

The notes (3.4 Video Decoder): "Master Cluster uses random sequence generator to
produce random video segment seed ... once for an epoch, before epoch begin ...
first random choose a class id, then random a video id in chosen class, at last
random a frame offset in chosen video ... with another constant parameter, frame
count to decode", and "Video Decoder execute following commands from Master
Cluster: start/stop/pause/resume Decoding". The master is also the bypass
monitor: stages report their per-batch counters to it.
"""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import numpy as np


def sample_segments(labels: list[int], lengths: list[int], video_ids: list[int], num_segments: int,
                    frame_count: int, seed: int, epoch: int, offset_stride: int = 1) -> list[dict]:
    """One epoch of segment seeds: ``[{"video", "label", "offset", "count"}]``.

    Class-balanced (a class uniformly, then a video of it, then an offset), and a
    pure function of (seed, epoch). Offsets lie in ``[0, length - count]`` on a grid
    of ``offset_stride`` frames (a coarser grid makes repeats, hence cache hits,
    likelier); a video shorter than ``count`` gets offset 0 and the short rule.
    """
    rng = np.random.default_rng([seed, epoch])
    by_class: dict[int, list[int]] = defaultdict(list)
    for v in video_ids:
        by_class[labels[v]].append(v)
    classes = sorted(by_class)
    if not classes:
        raise ValueError("no videos to sample from")
    segments = []
    for _ in range(num_segments):
        c = classes[rng.integers(len(classes))]
        v = by_class[c][rng.integers(len(by_class[c]))]
        last_start = max(0, lengths[v] - frame_count) // offset_stride
        offset = int(rng.integers(last_start + 1)) * offset_stride
        segments.append({"video": int(v), "label": int(c), "offset": offset, "count": int(frame_count)})
    return segments


def evenly_spaced_segments(labels: list[int], lengths: list[int], video_ids: list[int],
                           per_video: int, frame_count: int) -> list[dict]:
    """Fixed segments for evaluation: ``per_video`` evenly spaced offsets per video (TSN testing)."""
    segments = []
    for v in video_ids:
        last_start = max(0, lengths[v] - frame_count)
        for k, offset in enumerate(np.linspace(0, last_start, per_video).round().astype(int)):
            segments.append({"video": int(v), "label": int(labels[v]), "offset": int(offset),
                             "count": int(frame_count), "segment": k})
    return segments


class Master:
    """Control state + sampler + stage monitor. Run it as a Ray actor (``start_master``).

    States: ``running`` -> ``paused`` -> ``running`` ... -> ``stopped``. Segment seeds pass
    ``release()`` on their way to the decode stage (pipeline.release_segments): it holds them
    while paused, keeps at most a window of them in the decode stage per dataset (a *flow*), and
    drops them once stopped. The decode workers report each batch done (``decoded``).
    """

    def __init__(self, labels: list[int], lengths: list[int], seed: int):
        self.labels, self.lengths, self.seed = labels, lengths, seed
        self._state = "running"
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._control_order = 0                             # the newest numbered pause/resume applied
        self._stats: dict[str, dict] = {}
        self._held = 0                                      # releases a pause held back
        self._gate_callers: set[tuple[str, int]] = set()    # (node, process) of every gate task
        self._flows: dict[str, list[int]] = {}              # flow -> [released, decoded, next due]
        self._progress = asyncio.Condition()
        self._bad_files: dict[str, str] = {}
        self._operator_summaries: list[dict] = []

    # --- control: start / stop / pause / resume decoding ---------------------
    async def start(self) -> str:
        self._state = "running"
        self._resumed.set()
        return self._state

    async def pause(self, order: int | None = None) -> str:
        if self._in_order(order) and self._state == "running":
            self._state = "paused"
            self._resumed.clear()
        return self._state

    async def resume(self, order: int | None = None) -> str:
        if self._in_order(order) and self._state == "paused":
            self._state = "running"
            self._resumed.set()
        return self._state

    def _in_order(self, order: int | None) -> bool:
        """Whether a pause or resume numbered ``order`` by its sender is newer than the last one
        applied (None: unnumbered, always). Ray runs an async actor's calls in any order, so a
        feeder's pause and the resume sent right after it may arrive swapped: applied as they
        came, decoding stayed paused with the trainers waiting for it (a run that hung)."""
        if order is None:
            return True
        if order <= self._control_order:
            return False
        self._control_order = order
        return True

    async def stop(self) -> str:
        self._state = "stopped"
        self._resumed.set()  # wake held releases so their datasets can drain and finish
        # the feeder's numbered pauses end here: one still on its way must not pause the
        # decoding that a start (inference, after a run met its target) asks for next
        self._control_order = float("inf")
        async with self._progress:
            self._progress.notify_all()
        return self._state

    async def state(self) -> str:
        return self._state

    async def release(self, flow: str, segments: int, window: int, first: int | None = None,
                      caller: tuple[str, int] | None = None) -> bool:
        """Let ``segments`` seeds of dataset ``flow`` go on to decoding: True = decode them,
        False = drop them (stopped). Waits while paused, and while ``window`` seeds of the flow
        are already released and not yet decoded (a paused pool then runs dry and can shrink).

        ``first``: the position of the block's first seed in its dataset. Blocks are then let in
        in their dataset's order, however their gate tasks arrive (several run at once, so the
        decode actors start together): a later block let in first would wait undecoded for the
        earlier one in the ordered dataset and could fill the window the earlier one waits on
        (runs hung so, commit ebfa0dc). A block before the next one due was let in already: a
        gate task run again (Ray retries one whose node was lost, and reconstructs a lost output
        by running its task again) goes in at once and is not counted twice, since its seeds are
        decoded once (counted twice, it would hold a block of the window for the rest of the run).
        ``caller``: the gate task's (node id, process id), counted by ``gate_callers``."""
        counts = self._flows.setdefault(flow, [0, 0, 0])    # released, decoded, next first due
        if caller is not None:
            self._gate_callers.add(tuple(caller))
        if not self._resumed.is_set():
            self._held += 1
        while True:
            await self._resumed.wait()
            if self._state != "running":
                return False
            async with self._progress:   # checked under the lock: no decoded() slips by unseen
                if first is not None and first < counts[2]:
                    return True          # let in before: its seeds are counted
                in_turn = first is None or first == counts[2]
                if in_turn and counts[0] - counts[1] < window:
                    counts[0] += segments
                    if first is not None:
                        counts[2] = max(counts[2], first + segments)
                        self._progress.notify_all()   # the block after this one may be waiting its turn
                    return True
                await self._progress.wait()

    async def decoded(self, flow: str, segments: int) -> None:
        """A decode worker finished a batch of ``segments`` seeds of ``flow``."""
        counts = self._flows.setdefault(flow, [0, 0, 0])
        counts[1] += segments
        async with self._progress:
            self._progress.notify_all()

    async def held_releases(self) -> int:
        """How many releases a pause has held back so far."""
        return self._held

    async def gate_callers(self) -> dict[str, float]:
        """The nodes and the processes the gate's tasks ran in so far: one node (the driver's,
        pipeline.build_dataset), and a process more only where one sat idle long enough for Ray
        to end it."""
        return {"pipeline/gate_nodes": float(len({node for node, _ in self._gate_callers})),
                "pipeline/gate_processes": float(len(self._gate_callers))}

    # --- sampling ------------------------------------------------------------
    async def epoch_segments(self, video_ids: list[int], num_segments: int, frame_count: int,
                             epoch: int, offset_stride: int = 1) -> list[dict]:
        """The epoch's segment seeds, drawn before the epoch begins."""
        return sample_segments(self.labels, self.lengths, video_ids, num_segments, frame_count,
                               self.seed, epoch, offset_stride)

    # --- bypass monitoring -----------------------------------------------------
    async def report(self, stage: str, actor: str, items: int, busy_s: float, bytes_out: int,
                     **extra: float) -> None:
        """A stage's counters for one batch (summed per stage; actors counted distinct)."""
        s = self._stats.setdefault(stage, {"items": 0, "busy_s": 0.0, "bytes": 0, "actors": set(),
                                           "first": time.time(), "last": 0.0})
        s["items"] += items
        s["busy_s"] += busy_s
        s["bytes"] += bytes_out
        s["actors"].add(actor)
        s["last"] = time.time()
        for k, v in extra.items():
            s[k] = s.get(k, 0) + v

    async def bad_file(self, path: str, reason: str) -> None:
        """A decode worker met a file it could not decode; it skipped the segment."""
        self._bad_files[path] = reason

    async def bad_files(self) -> dict[str, str]:
        return dict(self._bad_files)

    async def operator_report(self, summary: dict) -> None:
        """One Ray Data execution's per-operator summary (operator_metrics.OperatorProbe)."""
        self._operator_summaries.append(summary)

    async def operator_summaries(self, reset: bool = False) -> list[dict]:
        out = list(self._operator_summaries)
        if reset:
            self._operator_summaries = []
        return out

    async def stage_stats(self, reset: bool = False) -> dict[str, dict]:
        """Per-stage totals; ``actors`` is the number of distinct actors that did work."""
        out = {k: {**v, "actors": len(v["actors"])} for k, v in self._stats.items()}
        if reset:
            self._stats = {}
        return out


def start_master(labels: list[int], lengths: list[int], seed: int):
    """Start the master as an async Ray actor; returns its handle.

    Named (``handle.actor_name``), so that Ray Data's operator probes, which
    run wherever a dataset executes, can find it.
    """
    import uuid

    import ray

    name = f"orchard_video_master_{uuid.uuid4().hex[:12]}"
    # Async actor: a held release() must not block stop()/resume()/decoded() or other datasets.
    # on the driver's node: its sampler and decode control hold no checkpoint (node_loss.py)
    from orchard.api import on_this_node

    handle = ray.remote(num_cpus=0, max_concurrency=256)(Master).options(name=name, **on_this_node()).remote(
        labels, lengths, seed)
    handle.actor_name = name
    return handle
