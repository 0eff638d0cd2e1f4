"""workload=video pipeline benchmark: orchard's decode and feature stages against plain loops on
the same clips and the same number of cores, decord and torchcodec among them.

    python -m bench video            # ~6 min on 2 idle cores (3 repeats)

What is compared: frames/s of decoding `clips` segments of `count` frames at exact offsets
(seek to the keyframe before, decode forward, match frames by pts) from synthetic H.264 videos.
Why it is fair:
- the same work: every peer decodes the same segments of the same files to the same RGB frames;
  quality is output equality, a checksum of every decoded pixel of each side (equal checksums:
  the same frames came out);
- timed alike: every side wall to wall, from its first request to its last frame, after one
  untimed warm-up pass of every side (the peers' process pool started, the imports done, Ray's
  workers up, the files in the OS cache). orchard's side is a running pipeline, as a run has
  one: since 2ac1df4 a video run is one Ray Data execution (validation segments, every epoch,
  inference windows), so its actor pools start once a run as the loop's pool starts once a
  bench. One execution carries every pass (`WarmPipeline`); a gate where a run's master holds its
  segments, in front of the decode stage, lets one pass through per timed run, which counts
  from letting it in to its last row consumed: the pipeline's fill is in the figure, its actors'
  start is the warm-up's. What a new execution costs a pass (its actors' processes start with
  it: Ray Data has no pool that outlives an execution) is its own row, a pass through a new
  execution against one through the running pipeline;
- the same cores, measured, never multiplied: orchard's Ray Data decode stage runs N actors x 1
  FFmpeg thread on a Ray of N CPUs (each actor reserving a share that lets the bench's pipelines
  all fit, a reservation, not a limit); the plain PyAV loop runs
  - in N processes x 1 FFmpeg thread (a ProcessPoolExecutor, the loop split across them), and
  - in 1 process with FFmpeg's own threading as PyAV documents it (`stream.thread_type = "AUTO"`,
    `codec_context.thread_count = N`): frame and slice threads inside the decoder;
  decord (`VideoReader(width=W, height=H, num_threads=N).get_batch`, resized by decord itself,
  and again decoded at the file's size, resized with cv2 where the size differs, for the checksum
  row) and
  torchcodec (`VideoDecoder(seek_mode="exact", num_ffmpeg_threads=N).get_frames_at`) with N
  threads, as their docs use them; torchcodec runs in a child process over the FFmpeg 8 that
  PyAV's wheel ships (`bench/torchcodec_peer.py`), so it and PyAV call the very same FFmpeg
  build, and where it cannot load its row says why. The synthetic files are encoded at the decoded size (as the
  workload's default is), so neither resize runs and both decord rows compare their checksums;
- no steady-state figure from a first batch on: it would leave orchard's pipeline fill out and
  count blocks decoded before the clock started, which the peers cannot do. Instead a marginal
  rate measured the same way for orchard and the N-process loop: each timed wall to wall over
  `clips` and over 2 x `clips` (the first half the same segments), the extra frames over the
  extra time; what a pass pays once (orchard's pipeline fill) cancels, and its size is shown as
  the fixed seconds (the time at `clips` less those frames at the marginal rate);
- the target: orchard's decode stage >= 1.0x the fastest peer with the same cores (the row that
  carries it is the fastest peer's);
- `+ rgb + flow`: orchard's decode + rgb + DIS-flow stages against the N-process PyAV loop running
  the same extractors (the project's own extractor code) on the same clips, the checksum over
  both features;
- what a block shares: the 960 clips are 40 a 64-frame video, so a block's clips of one video
  overlap; orchard decodes such a block's frames in one pass over the file and computes each
  distinct frame pair's flow once (`extractors.extract_many`), where the loops, as written clip by
  clip, do each clip's work whole. A row of clips that share no frame (two a video, end to end)
  shows a clip's own cost through the pipeline, where nothing is shared; on the same clips, a
  row where the loop's processes hand every clip to their parent (as a PyTorch DataLoader's
  workers hand batches to the training process) compares the hand-off too, which orchard's
  pipeline makes to its consumer and the plain loop, keeping its frames, does not;
- the disk cache: the same decode + rgb + flow pass cold, then warm, over the same segments, with
  the MiB the cache holds beside the MiB of video (the notes' storage-vs-compute trade);
- the 1 -> N actor speed-up: the same decode stage with 1 actor against N, same clips and output;
- the peers alternate within each repeat, so a change of load hits all of them.
Full mode also streams decoded clips totalling 4x a 100 MiB object store through decode +
framediff to a consumer slower than decoding and reports the pipeline's peak object-store use and
spilled bytes (bounded memory; orchard only).
"""
from __future__ import annotations

import importlib.util
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``)."""
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "n/a"


def _plain_decode(path: str, pts, offset: int, count: int, size: int, threads: int):
    """The plain PyAV loop: seek to the keyframe before the first wanted pts, decode forward."""
    import av
    import cv2
    import numpy as np

    want = {int(p): i for i, p in enumerate(pts[offset:offset + count])}
    out = [None] * count
    with av.open(path) as container:
        stream = container.streams.video[0]
        if threads > 1:
            stream.thread_type = "AUTO"
        stream.codec_context.thread_count = threads
        container.seek(int(pts[offset]), stream=stream, backward=True, any_frame=False)
        got = 0
        for frame in container.decode(stream):
            i = want.get(frame.pts)
            if i is not None:
                rgb = frame.to_ndarray(format="rgb24")
                if rgb.shape[0] != size:
                    rgb = cv2.resize(rgb, (size, size), interpolation=cv2.INTER_AREA)
                out[i] = rgb
                got += 1
                if got == count:
                    break
    return np.stack(out)


def _plain_chunk(jobs, size: int, threads: int, features: list, stack: int) -> tuple[int, int]:
    import numpy as np

    from workloads.video.extractors import build_extractor

    extractors = [build_extractor(f, stack=stack, method="dis_medium") for f in features]
    frames = checksum = 0
    for path, pts, offset, count in jobs:
        clip = _plain_decode(path, pts, offset, count, size, threads)
        outputs = [ext(clip) for ext in extractors]
        frames += len(clip)
        # the decoded frames, or every feature (orchard's checksum reads the same columns)
        checksum += sum(int(np.asarray(out).sum(dtype="int64")) for out in outputs or [clip])
    return frames, checksum


def plain_procs(pool, jobs, size, cores, features=(), stack=10) -> tuple[float, int]:
    """(seconds, checksum) of the plain loop over ``jobs`` in ``cores`` processes, 1 FFmpeg thread each."""
    chunks = [jobs[i::cores] for i in range(cores)]
    t0 = time.perf_counter()
    out = list(pool.map(_plain_chunk, chunks, [size] * cores, [1] * cores, [list(features)] * cores,
                        [stack] * cores))
    return time.perf_counter() - t0, sum(c for _, c in out)


def plain_procs_to_parent(pool, jobs, size) -> tuple[float, int]:
    """(seconds, checksum) of the plain loop in ``pool``'s processes handing every decoded clip to
    the parent, which reads it there (the checksum), as a PyTorch ``DataLoader``'s worker processes
    hand their batches to the training process: what orchard's pipeline does for its trainers, and
    what ``plain_procs`` leaves out (its processes keep their frames and return a checksum)."""
    t0, checksum = time.perf_counter(), 0
    args = zip(*[(path, pts, offset, count, size, 1) for path, pts, offset, count in jobs])
    for clip in pool.map(_plain_decode, *args, chunksize=8):
        checksum += int(clip.sum(dtype="int64"))
    return time.perf_counter() - t0, checksum


def plain_threads(jobs, size, cores) -> tuple[float, int]:
    t0 = time.perf_counter()
    _, checksum = _plain_chunk(jobs, size, cores, [], 10)
    return time.perf_counter() - t0, checksum


def decord_run(jobs, size, cores, own_resize: bool = True) -> tuple[float, int]:
    """decord as its docs use it: ``VideoReader(num_threads=N).get_batch(indices)``; frames resized
    by decord itself (``width``/``height``), or, for the checksum row, decoded at their own size and
    resized with cv2 INTER_AREA where the size differs, as the plain loop does. orchard's decoder
    scales in swscale as it converts (docs/video.md), a picture a grey level or so apart; the
    bench's files are encoded at the decoded size, so no side resizes and the checksums compare
    the decoders alone."""
    import cv2
    import decord
    import numpy as np

    t0, checksum = time.perf_counter(), 0
    for path, _, offset, count in jobs:
        shape = {"width": size, "height": size} if own_resize else {}
        vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=cores, **shape)
        clip = vr.get_batch(list(range(offset, offset + count))).asnumpy()
        if not own_resize and clip.shape[1] != size:
            clip = np.stack([cv2.resize(f, (size, size), interpolation=cv2.INTER_AREA) for f in clip])
        checksum += int(clip.sum(dtype="int64"))
    return time.perf_counter() - t0, checksum


def lone_clips(index, videos, count: int) -> list[dict]:
    """Segment seeds of clips that share no frame: two a video of ``videos`` (``2 x count`` frames
    long), end to end, shuffled (seed 0)."""
    clips = [{"video": v, "label": index.labels[v], "offset": o, "count": count} for v in videos for o in (0, count)]
    random.Random(0).shuffle(clips)
    return clips


def plain_jobs(index, segments) -> list[tuple]:
    """What the plain loops decode: (path, pts, offset, count) per segment of orchard's sampler."""
    return [(index.paths[s["video"]], index.pts[s["video"]], s["offset"], s["count"]) for s in segments]


def pipeline_settings(px: int, count: int, cores: int) -> dict:
    """orchard's video pipeline settings for the bench: frames of ``px`` pixels, clips of ``count``
    frames, one decode actor per core and half a core per extractor."""
    from omegaconf import OmegaConf

    shipped = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf/workload/video.yaml").video
    return {"size": px, "stack": count - 1, "short_rule": "loop", "decoder": "pyav",
            "extractor_options": {"flow": {"method": "dis_medium", "bound": 20}},
            # the workload's own block size and fusion (conf/workload/video.yaml), as a user runs it
            "pipeline_batch": int(shipped.pipeline_batch), "fuse_extract": shipped.fuse_extract,
            "decode_concurrency": cores, "decode_cpus": 1.0, "extract_concurrency": cores, "extract_cpus": 0.5}


def process_cpu() -> dict[int, tuple[str, float]]:
    """``{pid: (role, CPU seconds so far)}`` of this process and every process under it: the
    plain loop's pool processes and the embedded Ray's (raylet, GCS, its workers and actors)."""
    import psutil

    me, out = psutil.Process(), {}
    mine = me.cmdline()
    for p in [me, *me.children(recursive=True)]:
        try:
            line = " ".join(p.cmdline()[:1])
            role = ("driver (Ray Data's executor and the consumer)" if p.pid == me.pid else
                    "decode actors" if "DecodeStage" in line else "extract actors" if "ExtractStage" in line else
                    "the loop's processes" if p.cmdline() == mine else   # the pool's forks of this process
                    "raylet and GCS" if any(k in line for k in ("raylet", "gcs_server")) else "Ray's other processes")
            out[p.pid] = (role, sum(p.cpu_times()[:2]))
        except (psutil.Error, IndexError):
            pass
    return out


def cpu_by_role(fn, every_s: float = 0.2) -> tuple[tuple[float, int], dict[str, float]]:
    """``fn()``'s result and the CPU seconds each role spent while it ran. The processes are
    sampled every ``every_s`` while it runs, so an actor that Ray Data ends before the pass does
    (an upstream stage's pool) counts up to its last sample."""
    import threading

    before, last, done = process_cpu(), {}, threading.Event()

    def sample():
        while True:
            last.update(process_cpu())
            if done.wait(every_s):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    last.update(process_cpu())
    used: dict[str, float] = {}
    for pid, (role, cpu) in last.items():
        used[role] = used.get(role, 0.0) + cpu - before.get(pid, (role, 0.0))[1]
    return result, used


def column_sum(batch: dict, columns: list[str]) -> int:
    """orchard's side of the checksum: the sum of every value of ``columns`` in a batch."""
    return sum(int(batch[c].sum(dtype="int64")) for c in columns)


def orchard_run(segments, index, vcfg, features, cache=None) -> tuple[float, int]:
    """(seconds, checksum of every feature) of the Ray Data pipeline, wall to wall: from the
    request (the dataset built) to the last frame consumed, as the peers are timed. The pipeline's
    fill and its actors' start are inside the figure; nothing is scaled."""
    from workloads.video.pipeline import build_dataset, consume

    t0 = time.perf_counter()
    ds = build_dataset(segments, features, index.paths, index.lengths, vcfg, None, cache,
                       pts=index.pts, digests=index.digests)
    columns = features or ["frames"]
    checksum = 0
    for batch, _ in consume(ds, 16, columns):
        checksum += column_sum(batch, columns)
    return time.perf_counter() - t0, checksum


class WarmPipeline:
    """orchard's pipeline kept running across passes, as a run keeps it: since 2ac1df4 a video run
    is one Ray Data execution (validation segments, every epoch, inference windows), so its actor
    pools start once a run, as the loop's process pool starts once a bench. One execution carries
    ``passes`` copies of ``segments`` (tagged by pass); a gate in front of the decode stage (where
    a run's master holds its segments: pipeline.release_segments) lets one pass's segments through
    per ``run()``, which is timed wall to wall like the peers: from letting them in to their last
    row consumed, the pipeline's fill included, its actors' start not (that is the first, untimed
    pass's, as the peers' pool start is their warm-up's)."""

    def __init__(self, segments, passes: int, index, vcfg, features):
        import ray

        from workloads.video.pipeline import block_size, build_dataset

        # blocks never straddle two passes (the gate lets whole blocks through): the largest block
        # that divides a pass, no larger than the pipeline's own choice for one pass (a run sizes
        # its blocks for an epoch, the bench's pass; a new execution's choice is the same)
        cap = block_size(len(segments), vcfg, int(segments[0]["count"]))
        block = max(d for d in range(1, cap + 1) if len(segments) % d == 0)
        vcfg = dict(vcfg, pipeline_batch=block)
        self.gate = ray.remote(PassGate).options(num_cpus=0).remote()
        self.per_pass, self.columns = len(segments), features or ["frames"]
        tagged = [{**s, "epoch": p} for p in range(passes) for s in segments]
        ds = build_dataset(tagged, features, index.paths, index.lengths, vcfg, self.gate, None,
                           pts=index.pts, digests=index.digests, release=release_pass)
        # read block by block, nothing fetched ahead: Ray Data's iterator hands a batch out only once
        # it holds the next one (prefetch_batches=1), which would be the next pass's, held at the gate
        self.rows = iter(ds.iter_batches(batch_size=block, batch_format="numpy", prefetch_batches=0))
        self.done = 0
        ray.get(self.gate.actors.remote())   # the gate is up before the first pass is timed

    def run(self) -> tuple[float, int]:
        import ray

        t0 = time.perf_counter()
        ray.get(self.gate.allow.remote(self.done))
        seen = checksum = 0
        while seen < self.per_pass:
            batch = next(self.rows)
            assert (batch["epoch"] == self.done).all(), "a pass's rows came with another's"
            seen += len(batch["epoch"])
            checksum += column_sum(batch, self.columns)
        self.done += 1
        return time.perf_counter() - t0, checksum

    def close(self) -> None:
        close = getattr(self.rows, "close", None)
        if close is not None:
            close()


def release_pass(batch: dict, first: int, master, flow: str, window: int) -> bool:
    """The bench's gate in front of decoding (``build_dataset``'s ``release``): a block of pass p
    waits at the ``PassGate`` (``master``) until pass p is let in. By the block's pass tag, not by
    a count of segments: the gate tasks run several at a time and may reach the gate out of order,
    and a pass's blocks are all let in at once."""
    import ray

    ray.get(master.release.remote(int(batch["epoch"][0])))
    return True


class PassGate:
    """The bench's stand-in for a run's master in front of the decode stage (a Ray actor): it holds
    each pass's segment seeds until ``allow`` lets that pass in, and records which actors decoded
    (``actors``: the same ones pass after pass)."""

    def __init__(self):
        import asyncio

        self.allowed, self.seen = -1, set()     # the last pass let in
        self.more = asyncio.Condition()

    async def allow(self, pass_: int) -> None:
        async with self.more:
            self.allowed = max(self.allowed, pass_)
            self.more.notify_all()

    async def release(self, pass_: int) -> None:
        async with self.more:
            await self.more.wait_for(lambda: self.allowed >= pass_)

    async def decoded(self, flow: str, n: int) -> None:
        return None

    async def report(self, stage: str, actor: str, *args, **kwargs) -> None:
        self.seen.add((stage, actor))

    async def bad_file(self, path: str, reason: str) -> None:
        return None

    async def actors(self) -> list:
        return sorted(self.seen)


def memory_run(cores: int, store_mb: float, times: float) -> dict:
    """Stream `times` x the object store through decode + framediff; the memory figures."""
    import psutil
    import ray

    from bench.machine import start_ray
    from workloads.video.data import scan
    from workloads.video.master import sample_segments, start_master
    from workloads.video.operator_metrics import operator_metrics
    from workloads.video.pipeline import build_dataset
    from workloads.video.synthetic_videos import generate_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = generate_dataset(f"{tmp}/videos", 4, 2, size=32, num_frames=24)
        index = scan(str(root), val_fraction=0.0)
        clip_bytes = 5 * 128 * 128 * 3
        n = int(times * store_mb * 2**20 / clip_bytes)
        segments = sample_segments(index.labels, index.lengths, list(range(len(index.paths))), n, 5, 0, 0)
        vcfg = {"size": 128, "stack": 4, "short_rule": "loop", "decoder": "pyav", "extractor_options": {},
                "pipeline_batch": 16, "fuse_extract": False,   # apart: the frames themselves cross the store
                "decode_concurrency": 1, "decode_cpus": 0.5, "extract_concurrency": 1,
                "extract_cpus": 0.5}
        start_ray(num_cpus=cores, object_store_memory=int(store_mb * 2**20))
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            master = start_master(index.labels, index.lengths, 0)
            proc = psutil.Process()
            rss0 = rss_peak = proc.memory_info().rss
            for _ in build_dataset(segments, ["framediff"], index.paths, index.lengths, vcfg, master,
                                   pts=index.pts, digests=index.digests).iter_batches(batch_size=16, batch_format="numpy"):
                time.sleep(0.02)  # slower than decoding: without backpressure the store would fill
                rss_peak = max(rss_peak, proc.memory_info().rss)
            decoded = ray.get(master.stage_stats.remote())["decode"]["bytes"] / 2**20
            time.sleep(1.0)
            m = operator_metrics(ray.get(master.operator_summaries.remote()))
        finally:
            ray.shutdown()
    return {"streamed_mb": decoded, "store_mb": store_mb, "peak_store_mb": m["pipeline/store_mb_peak"],
            "spilled_mb": m["pipeline/decode_spilled_mb"] + m["pipeline/framediff_spilled_mb"],
            "driver_rss_growth_mb": (rss_peak - rss0) / 2**20}


def clip_anatomy(jobs, px: int, repeats: int) -> list[dict]:
    """One clip's CPU in one process, part by part, as the plain loop pays it and as orchard's
    decode stage does (its blocks' clips of one file in one pass, the file kept open): opening the
    file and starting its decoder, seeking and decoding, converting the wanted frames to RGB (each
    frame's own ``to_ndarray``, as the loop does, and through one swscale context kept for every
    frame, as orchard's decoder does). ``process_time`` over the same clips, n = ``repeats``."""
    import av
    from av.video.reformatter import VideoReformatter

    from bench.rows import row
    from workloads.video.decoder import PyAVDecoder

    clips = jobs[:min(len(jobs), 256)]
    parts = {"open": [], "seek + decode": [], "to RGB": [], "to RGB, one kept swscale context": [],
             "whole clip (orchard's decoder, per block)": [], "whole clip (plain loop)": []}
    kept = VideoReformatter()
    for _ in range(repeats):
        t = time.process_time()
        for path, *_ in clips:
            with av.open(path) as c:
                c.streams.video[0].codec_context.thread_count = 1
        parts["open"].append(time.process_time() - t)
        decode_s = rgb_s = kept_s = 0.0
        for path, pts, offset, count in clips:
            with av.open(path) as c:
                stream = c.streams.video[0]
                stream.codec_context.thread_count = 1
                want, got = {int(p) for p in pts[offset:offset + count]}, 0
                t = time.process_time()
                c.seek(int(pts[offset]), stream=stream, backward=True, any_frame=False)
                for frame in c.decode(stream):
                    if frame.pts in want:
                        t1 = time.process_time()
                        frame.to_ndarray(format="rgb24")
                        rgb_s += time.process_time() - t1
                        t1 = time.process_time()
                        kept.reformat(frame, format="rgb24", threads=1).to_ndarray()
                        kept_s += time.process_time() - t1
                        got += 1
                        if got == count:
                            break
                decode_s += time.process_time() - t
        parts["seek + decode"].append(decode_s - rgb_s - kept_s)
        parts["to RGB"].append(rgb_s)
        parts["to RGB, one kept swscale context"].append(kept_s)
        t = time.process_time()
        for path, pts, offset, count in clips:
            _plain_decode(path, pts, offset, count, px, 1)
        parts["whole clip (plain loop)"].append(time.process_time() - t)
        dec, t = PyAVDecoder(size=px), time.process_time()
        for i in range(0, len(clips), 64):   # as the decode stage does a 64-clip block
            by_file: dict[str, list] = {}
            for path, pts, offset, count in clips[i:i + 64]:
                by_file.setdefault(path, [pts, []])[1].append((offset, count))
            for path, (pts, requests) in by_file.items():
                dec.decode_many(path, requests, pts=pts)
        dec.close()
        parts["whole clip (orchard's decoder, per block)"].append(time.process_time() - t)
    return [row(f"profile: one clip's CPU ms in one process: {part}", "ms", [1e3 * v / len(clips) for v in values],
                None, orchard_label="PyAV, 1 thread", peer_label=None, higher_is_better=False,
                quality={"orchard": {"clips": len(clips)}})
            for part, values in parts.items()]


# marginal: also time twice the clips (not at smoke size, where a pass's start is all there is)
# lone_videos: the videos of the clips that share no frame (two clips each, end to end)
SIZES = {"full": {"videos": 24, "frames": 64, "clips": 960, "count": 11, "size": 112, "memory": True, "marginal": True,
                  "lone_videos": 192},
         "smoke": {"videos": 4, "frames": 24, "clips": 8, "count": 5, "size": 32, "memory": False, "marginal": False,
                   "lone_videos": 4}}
ESTIMATE = "~13 min on 2 idle cores (3 repeats)"


def measure(size: dict, repeats: int) -> list[dict]:
    import ray

    from bench import torchcodec_peer
    from bench.machine import start_ray
    from bench.rows import absent, row
    from orchard import cluster
    from workloads.video.cache import make_cache
    from workloads.video.data import scan
    from workloads.video.master import sample_segments
    from workloads.video.synthetic_videos import generate_dataset

    cores = os.cpu_count() or 1
    clips, count, px = size["clips"], size["count"], size["size"]
    frames = clips * count
    with tempfile.TemporaryDirectory() as tmp:
        root = generate_dataset(f"{tmp}/videos", 4, size["videos"] // 4, size=px, num_frames=size["frames"])
        index = scan(str(root), val_fraction=0.0)
        segments = sample_segments(index.labels, index.lengths, list(range(len(index.paths))), clips, count,
                                   seed=0, epoch=0)
        jobs = plain_jobs(index, segments)
        # twice the clips (the first half the same segments): the marginal rate of each side is the
        # extra frames over the extra time, so fixed costs (a pipeline's start) cancel on both sides
        more = segments + sample_segments(index.labels, index.lengths, list(range(len(index.paths))), clips, count,
                                          seed=1, epoch=0)
        more_jobs = plain_jobs(index, more)
        # clips that share no frame (two a video, end to end, shuffled): the 960 clips are 40 a
        # 64-frame video, so a block's clips of one video share frames and frame pairs, which
        # orchard decodes and extracts once; here nothing is shared and a clip's own cost shows
        lone_index = scan(str(generate_dataset(f"{tmp}/lone", 4, size["lone_videos"] // 4, size=px,
                                               num_frames=2 * count)), val_fraction=0.0)
        lone = lone_clips(lone_index, range(len(lone_index.paths)), count)
        lone_jobs = plain_jobs(lone_index, lone)
        vcfg = pipeline_settings(px, count, cores)
        # every pipeline of the bench alive at once (five running ones and a new one a repeat):
        # each actor reserves a share that lets them all fit Ray's CPUs. A share is a reservation,
        # not a limit (an actor decodes on one FFmpeg thread whatever it holds); the workload's
        # own default is 0.25 (conf/workload/video.yaml)
        share = round(cores / (5 * cores + 1), 3)
        vcfg = dict(vcfg, decode_cpus=share, extract_cpus=share)
        has_decord = importlib.util.find_spec("decord") is not None
        no_torchcodec = torchcodec_peer.absent()
        passes = 1 + repeats        # the untimed warm-up's, then one per repeat
        warm = {}                   # orchard's running pipelines (WarmPipeline), started with Ray below
        peers = {"orchard": lambda: warm["orchard"].run(),
                 # a pass through a new execution: what its start costs (the actors' processes)
                 "orchard cold": lambda: orchard_run(segments, index, vcfg, []),
                 # the same stage with one decode actor: the 1 -> N actor speed-up (docs/scaling.md)
                 "orchard@1": lambda: warm["orchard@1"].run(),
                 "procs": lambda: plain_procs(pool, jobs, px, cores),
                 **({"orchard x2": lambda: warm["orchard x2"].run(),
                     "procs x2": lambda: plain_procs(pool, more_jobs, px, cores)} if size["marginal"] else {}),
                 "orchard lone": lambda: warm["orchard lone"].run(),
                 "procs lone": lambda: plain_procs(pool, lone_jobs, px, cores),
                 "procs lone to parent": lambda: plain_procs_to_parent(pool, lone_jobs, px),
                 "threads": lambda: plain_threads(jobs, px, cores),
                 **({"decord": lambda: decord_run(jobs, px, cores),
                     "decord+cv2": lambda: decord_run(jobs, px, cores, own_resize=False)} if has_decord else {}),
                 **({} if no_torchcodec else {"torchcodec": lambda: torchcodec_peer.run(jobs, px, cores)}),
                 "orchard+flow": lambda: warm["orchard+flow"].run(),
                 "procs+flow": lambda: plain_procs(pool, jobs, px, cores, ["rgb", "flow"], count - 1)}
        got = {name: [] for name in peers}
        cpu = {name: [] for name in peers}    # CPU seconds by role (process_cpu), per repeat
        failed = {}
        cluster.prepare_local_env()  # Ray workers import workloads/ from this checkout
        start_ray(num_cpus=cores)
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            warm.update({"orchard": WarmPipeline(segments, passes, index, vcfg, []),
                         "orchard@1": WarmPipeline(segments, passes, index, dict(vcfg, decode_concurrency=1), []),
                         **({"orchard x2": WarmPipeline(more, passes, index, vcfg, [])} if size["marginal"] else {}),
                         "orchard lone": WarmPipeline(lone, passes, lone_index, vcfg, []),
                         "orchard+flow": WarmPipeline(segments, passes, index, vcfg, ["rgb", "flow"])})
            with ProcessPoolExecutor(cores) as pool:
                # one untimed pass of every side first: the pool's processes started, av/cv2/decord
                # imported, Ray's workers warm, the files in the OS cache; then every side is timed
                # wall to wall, the sides alternating within each repeat
                for name, fn in peers.items():
                    try:
                        fn()
                    except Exception as exc:  # noqa: BLE001 - a peer that installs but cannot run here
                        failed[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
                for _ in range(repeats):
                    for name, fn in peers.items():
                        if name in failed:
                            continue
                        try:
                            result, used = cpu_by_role(fn)
                            got[name].append(result)
                            cpu[name].append(used)
                            print(f"  video: {name}: {got[name][-1][0]:.2f} s", flush=True)
                        except Exception as exc:  # noqa: BLE001
                            failed[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
            # the same actors decoded every pass of a running pipeline (the gate saw who reported)
            kept = {name: len(ray.get(w.gate.actors.remote())) for name, w in warm.items()}
            for w in warm.values():
                w.close()
            cache_runs = []
            for _ in range(repeats):  # the storage-vs-compute trade: a fresh disk cache, cold then warm
                cache = make_cache("disk", f"{tmp}/cache{len(cache_runs)}", max_mb=4096)
                cold, cold_sum = orchard_run(segments, index, vcfg, ["rgb", "flow"], cache)
                warm, warm_sum = orchard_run(segments, index, vcfg, ["rgb", "flow"], cache)
                cache_runs.append((cold, warm, cache.total_bytes() / 2**20, warm_sum == cold_sum))
        finally:
            ray.shutdown()
        video_mb = index.video_bytes / 2**20
        anatomy = clip_anatomy(jobs, px, repeats)   # in one process, Ray down: nothing beside it
    if {"orchard", "orchard cold", "orchard@1", "orchard+flow", "orchard lone"} & set(failed):
        raise RuntimeError(f"orchard failed: {failed}")

    def fps(name):
        return [frames / t for t, _ in got[name]]

    def fixed(name):  # the median over repeats of the time a pass pays whatever its length
        pairs = list(zip(got[name], got[f"{name} x2"]))
        return statistics.median(2 * t1 - t2 for (t1, _), (t2, _) in pairs) if pairs else None

    def same(name, base):  # output equality: the checksums of the same clips' decoded frames or features
        return {"checksum": "equal to orchard's" if got[name][-1][1] == got[base][-1][1] else
                f"DIFFERS ({got[name][-1][1]} vs {got[base][-1][1]})"}

    decoders = {"procs": f"PyAV loop, {cores} processes x 1 thread",
                "threads": f"PyAV loop, 1 process x {cores} FFmpeg threads (thread_type AUTO)",
                "decord": f"decord, {cores} threads, its own resize",
                "decord+cv2": f"decord, {cores} threads, orchard's resize (the checksum row)",
                "torchcodec": f"torchcodec, {cores} FFmpeg threads, seek_mode exact"}
    measured = {n: statistics.median(fps(n)) for n in decoders if got.get(n) and n not in failed}
    fastest = max(measured, key=measured.get) if measured else None

    def decode_row(name, label):
        title = f"decode {clips} clips x {count} frames at {px}x{px}: orchard vs {label}"
        if name in failed:
            return row(title, "frames/s", [], [], orchard_label="orchard", peer_label=label,
                       higher_is_better=True, status=f"failed: {failed[name]}")
        # the video target is read against the fastest peer with the same cores
        target = {"text": "orchard's decode stage >= 1.0x the fastest peer", "min_ratio": 1.0} if name == fastest else None
        return row(title, "frames/s", fps("orchard"), fps(name), higher_is_better=True,
                   orchard_label=f"Ray Data decode stage, {cores} actors x 1 thread, running pipeline",
                   peer_label=label, quality={"orchard": {"frames": frames, "actors over the passes": kept["orchard"]},
                                              "peer": same(name, "orchard")}, target=target)

    rows = [decode_row("procs", decoders["procs"]), decode_row("threads", decoders["threads"])]
    # what a new execution costs a pass: its actor pools' processes start (Ray Data has no pool that
    # outlives an execution); a run pays it once since all its segments ride one execution
    rows.append(row(f"pipeline start: orchard's decode stage, {clips} clips, a running pipeline vs a new one",
                    "frames/s", fps("orchard"), fps("orchard cold"), higher_is_better=True,
                    orchard_label="through a running pipeline (its actors up)",
                    peer_label="through a new execution (its actors started with the pass)",
                    quality={"orchard": {"frames": frames}, "peer": same("orchard cold", "orchard")}))

    def marginal(name):  # each repeat's extra frames over its extra time, from clips to 2 x clips
        return [frames / (t2 - t1) if t2 > t1 else float("nan") for (t1, _), (t2, _) in zip(got[name], got[f"{name} x2"])]

    if size["marginal"] and got["orchard x2"] and got["procs x2"]:
        rows.append(row(f"decode, marginal rate from {clips} to {2 * clips} clips: orchard vs {decoders['procs']}",
                        "frames/s", marginal("orchard"), marginal("procs"), higher_is_better=True,
                        orchard_label=f"Ray Data decode stage, {cores} actors x 1 thread, running pipeline",
                        peer_label=decoders["procs"],
                        quality={"orchard": {"fixed s": fixed("orchard")}, "peer": {"fixed s": fixed("procs")}},
                        target={"text": "orchard's marginal rate >= 1.0x the loop's", "min_ratio": 1.0},
                        note="both sides timed wall to wall at both sizes; what a side pays once per pass "
                             "(the fixed s: its time at the first size less those frames at its marginal rate) cancels"))
    lone_frames = len(lone) * count
    if "procs lone" not in failed:
        rows.append(row(f"decode {len(lone)} clips that share no frame (2 a video): orchard vs {decoders['procs']}",
                        "frames/s", [lone_frames / t for t, _ in got["orchard lone"]],
                        [lone_frames / t for t, _ in got["procs lone"]], higher_is_better=True,
                        orchard_label=f"Ray Data decode stage, {cores} actors x 1 thread, running pipeline",
                        peer_label=decoders["procs"],
                        quality={"orchard": {"frames": lone_frames, "videos": len(lone_index.paths)},
                                 "peer": same("procs lone", "orchard lone")},
                        target={"text": "orchard's decode stage >= 1.0x the loop on clips that share no frame",
                                "min_ratio": 1.0},
                        note="no frame is decoded twice on either side: what orchard's blocks share (one pass a "
                             "file, a frame pair's flow once) cannot help; a clip's own cost through the pipeline"))
    to_parent = f"PyAV loop, {cores} processes x 1 thread, every clip handed to the parent"
    if "procs lone to parent" not in failed:
        # the same clips, the loop's frames delivered where they are read, as orchard's pipeline
        # delivers its frames to the consumer (a trainer): the like-for-like hand-off
        rows.append(row(f"decode {len(lone)} clips that share no frame, frames handed to the consumer: orchard vs "
                        f"{to_parent}", "frames/s", [lone_frames / t for t, _ in got["orchard lone"]],
                        [lone_frames / t for t, _ in got["procs lone to parent"]], higher_is_better=True,
                        orchard_label=f"Ray Data decode stage, {cores} actors x 1 thread, running pipeline",
                        peer_label=to_parent,
                        quality={"orchard": {"frames": lone_frames, "videos": len(lone_index.paths)},
                                 "peer": same("procs lone to parent", "orchard lone")},
                        target={"text": "orchard's decode stage >= 1.0x the delivering loop on clips that share "
                                        "no frame", "min_ratio": 1.0},
                        note="both sides deliver every frame to one consumer process that reads it (orchard: the "
                             "driver's iterator; the loop: the parent of its pool, as a DataLoader's workers hand "
                             "batches to the training process); the row above keeps the loop's frames in its workers"))
    rows.append(row(f"decode {clips} clips: orchard {cores} actors vs 1 (speed-up)", "frames/s", fps("orchard"),
                    fps("orchard@1"), higher_is_better=True, orchard_label=f"{cores} decode actors x 1 thread",
                    peer_label="1 decode actor x 1 thread",
                    quality={"orchard": {"frames": frames}, "peer": same("orchard@1", "orchard")}))
    for name in ("decord", "decord+cv2"):
        rows.append(decode_row(name, decoders[name]) if has_decord else
                    absent(f"decode: orchard vs {decoders[name]}", decoders[name], "not installed (decord)", "frames/s",
                           higher_is_better=True))
    if no_torchcodec:
        rows.append(absent(f"decode: orchard vs {decoders['torchcodec']}", decoders["torchcodec"], no_torchcodec[0],
                           "frames/s", higher_is_better=True, note=no_torchcodec[1]))
    else:
        rows.append(decode_row("torchcodec", decoders["torchcodec"]))
    title = f"decode + rgb + DIS flow, {clips} clips: orchard vs PyAV loop with the same extractors"
    if "procs+flow" in failed:
        rows.append(row(title, "frames/s", [], [], orchard_label="orchard", peer_label="PyAV loop",
                        higher_is_better=True, status=f"failed: {failed['procs+flow']}"))
    else:
        rows.append(row(title, "frames/s", fps("orchard+flow"), fps("procs+flow"), higher_is_better=True,
                        orchard_label="decode + rgb + flow stages, running pipeline",
                        peer_label=f"PyAV loop + extractors, {cores} processes",
                        quality={"orchard": {"clips": clips}, "peer": same("procs+flow", "orchard+flow")}))
    profiles = [("orchard", "procs", "decode", clips, decoders["procs"]),
                ("orchard+flow", "procs+flow", "decode + rgb + DIS flow", clips, decoders["procs"])]
    if "procs lone to parent" not in failed:
        profiles.append(("orchard lone", "procs lone to parent", f"decode {len(lone)} clips that share no frame",
                         len(lone), to_parent))
    for side, peer_side, what, n, label in profiles:
        per_clip = {k: [1e3 * sum(u.values()) / n for u in cpu[k]] for k in (side, peer_side)}
        roles = {k: {role: round(statistics.median(1e3 * u.get(role, 0.0) / n for u in cpu[k]), 3)
                     for role in sorted({r for u in cpu[k] for r in u})} for k in (side, peer_side)}
        rows.append(row(f"profile: CPU ms per clip, {what}: orchard vs {label}", "ms", per_clip[side],
                        per_clip[peer_side], higher_is_better=False, orchard_label="all of orchard's processes",
                        peer_label="the loop's processes (and the idle Ray beside them)",
                        quality={"orchard": roles[side], "peer": roles[peer_side]},
                        note="CPU seconds of every process under the bench (process_cpu) while the pass ran, per "
                             "clip, by role: where a clip's time goes on each side"))
    rows.extend(anatomy)
    rows.append(row("disk cache: decode + rgb + flow, warm vs cold", "frames/s", [frames / r[1] for r in cache_runs],
                    [frames / r[0] for r in cache_runs], higher_is_better=True,
                    orchard_label="warm cache", peer_label="cold cache (decode and extract, then write)",
                    quality={"orchard": {"cache MiB": cache_runs[-1][2],
                                         "rgb + flow checksum": "equal to cold's" if cache_runs[-1][3] else "DIFFERS"},
                             "peer": {"video MiB": video_mb}}))
    if size["memory"]:
        m = memory_run(cores, 100, 4)
        rows.append(row("clip stream of 4x a 100 MiB object store: peak object-store MiB", "MiB",
                        [m["peak_store_mb"]], None, orchard_label="decode + framediff pipeline", peer_label=None,
                        higher_is_better=False,
                        quality={"orchard": {"streamed MiB": m["streamed_mb"], "spilled MiB": m["spilled_mb"],
                                             "driver RSS growth MiB": m["driver_rss_growth_mb"]}},
                        target={"text": "bounded: peak < store, nothing spilled",
                                "met": m["peak_store_mb"] < m["store_mb"] and m["spilled_mb"] == 0}))
    return rows
