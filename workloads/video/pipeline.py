"""The streaming pipeline: segment seeds -> decode stage -> one stage per feature, in Ray Data.

Decode once: one dataset carries every feature the run's streams need; each segment
is decoded once and the clip passes through every feature stage (rgb, then flow, ...);
the frames are dropped after the last one and never leave the pipeline. The feeder
(feeder.py) hands each stream's trainers only their own feature. Rows come out in
segment order (``preserve_order``), so the same seed gives the same batches.
"""
from __future__ import annotations

import math
import time
import uuid

import numpy as np

from .extractors import build_extractor
from .operator_metrics import attach_probe
from .stages import DecodeStage, ExtractStage


def frame_count(features: list[str], stack: int, modules=()) -> int:
    """The constant frame count the master puts in every segment seed."""
    from .extractors import load_modules

    load_modules(modules)
    return max(build_extractor(f, stack=stack).frames_needed(stack) for f in features)


def _pool_max(value) -> int:
    return int(value) if isinstance(value, int) else int(value[1])


def _pool(value):
    """An autoscaling actor pool from ``n`` or ``[min, max]`` (Ray Data grows it on backlog)."""
    from ray.data import ActorPoolStrategy

    lo, hi = (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))
    return ActorPoolStrategy(min_size=lo, max_size=hi)


def block_size(per_pass: int, vcfg: dict, clip_frames: int) -> int:
    """Segments per Ray Data block: ``pipeline_batch``, or fewer where that would leave an actor of
    the decode pool without two blocks of a pass (``per_pass``: the segments a consumer takes in
    one go, an epoch's in a run, so its first rows come after one block, not a whole epoch), or
    where the block's decoded frames (``clip_frames`` frames a clip) would outgrow Ray Data's target
    block size (``DataContext.target_max_block_size``, 128 MiB by default).

    Blocks as large as that are cheaper: Ray Data's per-block work (a task, its output's metadata,
    a hop through the object store) is paid per block, not per clip, and a block's clips of one
    video share one pass over its file (``DecodeStage``) and their common frame pairs' flow
    (``extractors.extract_many``)."""
    from ray.data import DataContext

    per_actor = math.ceil(per_pass / (2 * _pool_max(vcfg["decode_concurrency"])))
    clip_bytes = max(1, clip_frames) * int(vcfg["size"]) ** 2 * 3
    by_bytes = (DataContext.get_current().target_max_block_size or 128 * 2**20) // clip_bytes
    return max(1, min(int(vcfg["pipeline_batch"]), per_actor, by_bytes))


def fused(vcfg: dict, cache) -> bool:
    """Whether the feature extractors run inside the decode actors (``video.fuse_extract``:
    true, false, or ``auto``: fused when the cache is off). Fused, the frames never leave the
    actor that decoded them; apart, each feature is its own elastic pool (the notes' extraction
    workers), and a cached feature is served without its extractor's pool doing any work."""
    choice = vcfg.get("fuse_extract", "auto")
    if choice == "auto":
        return not getattr(cache, "enabled", False)
    return bool(choice)


ORDER = "release_order"   # a seed's position in its dataset, read by the gate and dropped there


def release_segments(batch: dict, first: int, master, flow: str, window: int) -> bool:
    """The gate in front of decoding: one block of segment seeds passes when the master lets it
    (True), or is dropped once decoding stopped (False).

    It waits while decoding is paused, while ``window`` segments of this dataset are released but
    not yet decoded (counted in rows, as Ray Data may bundle blocks into one decode batch), and
    until the blocks before it (``first``: its first seed's position) are let in. Held back
    *before* the decode stage (not inside its task), a paused pool runs dry, so Ray Data's
    autoscaler can shrink it.
    """
    import os

    import ray

    caller = (ray.get_runtime_context().get_node_id(), os.getpid())
    return ray.get(master.release.remote(flow, len(batch["video"]), window, first, caller))


def _through_gate(batch: dict, release, master, flow: str, window: int) -> dict:
    """A block of seeds through ``release`` (``build_dataset``'s gate stage), without the order
    column it carried there; an empty block once the gate drops it."""
    order = batch.pop(ORDER)
    if len(order) and not release(batch, int(order[0]), master, flow, window):
        return {k: v[:0] for k, v in batch.items()}
    return batch


def build_dataset(segments: list[dict], features: list[str], paths: list[str], lengths: list[int],
                  vcfg: dict, master=None, cache=None, pts: list | None = None, digests: list[str] | None = None,
                  block: int | None = None, release=release_segments):
    """A lazy Ray Dataset of rows ``{video, label, offset, count, [segment], [epoch], <feature>...}``.

    ``vcfg`` is ``cfg["video"]``: ``size``, ``stack``, ``short_rule``, ``decoder``,
    ``extractor_options``, ``extractor_modules``, ``pipeline_batch``, ``decode_concurrency``
    (min, max), ``decode_cpus``, ``extract_concurrency``, ``extract_cpus``. ``pts`` and
    ``digests`` are the videos' frame indices and content digests (``dataset.scan``). ``block``:
    segments per block (``block_size``); None: sized for ``segments`` taken in one pass.
    ``release``: the gate in front of decoding, ``f(batch, first, master, flow, window) -> bool``
    (``first``: the block's first seed's position in ``segments``), run when there is a ``master``
    (a run's: ``release_segments``; the bench lets whole passes in by tag).
    """
    import ray

    from orchard.api import on_this_node

    batch = block or block_size(len(segments), vcfg, int(segments[0]["count"]) if segments else 1)
    modules = list(vcfg.get("extractor_modules") or [])
    flow = uuid.uuid4().hex          # this dataset's release counters at the master
    if master is not None:
        segments = [{**s, ORDER: i} for i, s in enumerate(segments)]
    ds = ray.data.from_items(segments, override_num_blocks=max(1, math.ceil(len(segments) / batch)))
    if master is not None:
        # one gate task per decode actor at a time, holding no CPU, so the actors' first blocks
        # are let in together: one at a time, Ray Data's executor started the next gate task a
        # loop step (up to 0.1 s) after the last one ended, and a pass of 4 blocks on 2 actors ran
        # no faster than on 1. The master lets blocks in in the dataset's order whatever order
        # their tasks reach it (Master.release). Enough segments in flight to keep the pool at its
        # max size busy (Ray Data queues up to 2 batches per actor) and one batch more each.
        # The gate's tasks run on the driver's node, beside the master they ask: Ray Data spreads
        # small tasks over the nodes, and a node's idle worker is ended a second after its task
        # where the node has more worker processes than CPUs (Ray's defaults), so spread gate tasks
        # more than half a second apart each started a process, which spaced them further: after
        # a lost node a test run's blocks went in one per process start (~3.4 s) for the rest of
        # the run (docs/video.md). On one node the next task finds the last one's process
        actors = _pool_max(vcfg["decode_concurrency"])
        window = 3 * batch * actors
        ds = ds.map_batches(_through_gate, batch_size=None, batch_format="numpy",
                            fn_kwargs=dict(release=release, master=master, flow=flow, window=window),
                            compute=ray.data.TaskPoolStrategy(size=actors), num_cpus=0, **on_this_node())
    extract = [dict(name=name, options=dict(vcfg["extractor_options"].get(name) or {}), stack=int(vcfg["stack"]),
                    paths=paths, size=int(vcfg["size"]), master=master, cache=cache,
                    drop_frames=i == len(features) - 1, modules=modules, digests=digests)
               for i, name in enumerate(features)]
    in_decode = fused(vcfg, cache) and bool(extract)
    ds = ds.map_batches(
        DecodeStage, batch_size=batch, batch_format="numpy",
        fn_constructor_kwargs=dict(paths=paths, lengths=lengths, size=int(vcfg["size"]),
                                   short_rule=vcfg["short_rule"], decoder=vcfg["decoder"],
                                   master=master, cache=cache, pts=pts, digests=digests, flow=flow,
                                   extract=extract if in_decode else None),
        compute=_pool(vcfg["decode_concurrency"]), num_cpus=float(vcfg["decode_cpus"]))
    for kwargs in [] if in_decode else extract:
        ds = ds.map_batches(ExtractStage, batch_size=batch, batch_format="numpy", fn_constructor_kwargs=kwargs,
                            compute=_pool(vcfg["extract_concurrency"]), num_cpus=float(vcfg["extract_cpus"]))
    ds.context.execution_options.preserve_order = True   # the same seed gives the same batches
    # Ray Data's own per-operator queue/backpressure figures go to the master (operator_metrics.py)
    return attach_probe(ds, getattr(master, "actor_name", None), ["decode", *features])


def consume(ds, batch_size: int, columns: list[str]):
    """Iterate numpy batches of ``columns`` from the driver; yields (batch, wait_s).

    ``wait_s`` is the time the consumer sat waiting for the pipeline: the share
    of the consumer's wall time it spends waiting is the pipeline's backpressure
    reading (near 0: the pipeline keeps up; near 1: the consumer starves).
    """
    it = iter(ds.iter_batches(batch_size=batch_size, batch_format="numpy"))
    while True:
        t0 = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            return
        yield {c: b[c] for c in columns}, time.perf_counter() - t0


def stage_metrics(stats: dict[str, dict], wall_s: float, prefix: str = "pipeline") -> dict[str, float]:
    """Per-stage metrics from the master's counters over a wall-clock window of ``wall_s`` s.

    ``items_per_s`` = items / wall; ``busy_actors`` = busy seconds / wall (the
    average number of actors working); ``actors`` = distinct actors that did work.
    """
    out: dict[str, float] = {}
    for stage, s in stats.items():
        p = f"{prefix}/{stage}"
        out[f"{p}_items_per_s"] = s["items"] / max(wall_s, 1e-9)
        out[f"{p}_busy_actors"] = s["busy_s"] / max(wall_s, 1e-9)
        # the share of its actors' time the stage spent working (the rest: waiting for input or output)
        out[f"{p}_busy_fraction"] = min(1.0, s["busy_s"] / max(wall_s * max(s["actors"], 1), 1e-9))
        out[f"{p}_actors"] = float(s["actors"])
        out[f"{p}_mb_out"] = s["bytes"] / 2**20
        out[f"{p}_cache_hits"] = float(s.get("hits", 0))
        out[f"{p}_cache_saved_s"] = float(s.get("saved_s", 0.0))
        if stage == "decode":
            out[f"{prefix}/decode_frames_per_s"] = s.get("frames", 0) / max(wall_s, 1e-9)
            out[f"{prefix}/decode_bad_segments"] = float(s.get("bad", 0))
    return out


def collect(ds, feature: str, meta_columns=("video", "label", "offset"), batch_size: int = 64):
    """Materialise a (small) dataset on the driver: ``(features, {column: values})``."""
    feats, meta = [], {c: [] for c in meta_columns}
    for b, _ in consume(ds, batch_size, [feature, *meta_columns]):
        feats.append(b[feature])
        for c in meta_columns:
            meta[c].append(b[c])
    return (np.concatenate(feats) if feats else np.zeros((0,))), \
        {c: np.concatenate(v) if v else np.zeros((0,), int) for c, v in meta.items()}
