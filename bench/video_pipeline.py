"""workload=video pipeline benchmark: orchard's decode+extract stages against plain loops on the
same clips and the same number of threads, plus decord and torchcodec where they are installed.

    .venv/bin/python bench/video_pipeline.py [--videos 24] [--clips 96] [--size 112] [--cores 2] [--repeats 3]

One run, one set of H.264 clips and segments (``--count`` frames each at an exact offset), every
peer measured ``--repeats`` times in turn; frames/s and clips/s are printed as min / median / max:

- ``orchard decode``: the Ray Data decode stage, ``--cores`` actors of 1 FFmpeg thread each
  (steady state: timed from the first batch, actor start-up excluded; Ray gets ``--cores`` CPUs);
- ``PyAV loop, N procs x 1 thread``: the simplest correct loop (seek to the keyframe before the
  offset, decode forward, match by pts) in ``--cores`` processes, each 1 FFmpeg thread;
- ``PyAV loop, 1 proc x N threads``: the same loop in one process with FFmpeg's own frame and
  slice threading on (``thread_type=AUTO``, ``--cores`` threads);
- ``decord`` (``VideoReader(num_threads=--cores).get_batch``) and ``torchcodec``
  (``VideoDecoder(seek_mode="exact", num_ffmpeg_threads=--cores).get_frames_at``), if importable;
- ``+ flow``: orchard's decode + rgb + DIS-flow stages, against the N-process PyAV loop running
  the same extractors;
- the storage-vs-compute trade: orchard's decode + rgb + flow with ``video.cache=disk``, a cold
  pass then a warm pass over the same segments, with the MiB the cache holds next to the MiB of
  the videos.

    .venv/bin/python bench/video_pipeline.py --memory [--store-mb 100] [--times 5]

instead streams decoded clips (decode + framediff, 128x128) totalling --times x the object
store of a Ray started with --store-mb MiB of object store, to a consumer slower than
decoding, and prints the pipeline's peak object-store use, spilled bytes and the driver's
RSS growth (bounded memory).

The machine's load average is printed beside the figures: figures taken under load are
"loaded", not a measure of the code. Timings are never asserted in tests.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
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


def _plain_chunk(jobs, size: int, threads: int, features: list, stack: int) -> int:
    from workloads.video.extractors import build_extractor

    extractors = [build_extractor(f, stack=stack, method="dis_medium") for f in features]
    frames = 0
    for path, pts, offset, count in jobs:
        clip = _plain_decode(path, pts, offset, count, size, threads)
        for ext in extractors:
            ext(clip)
        frames += len(clip)
    return frames


def plain_procs(pool, jobs, size, cores, features=(), stack=10) -> float:
    """Seconds for the plain loop over ``jobs`` in ``cores`` processes, 1 FFmpeg thread each."""
    chunks = [jobs[i::cores] for i in range(cores)]
    t0 = time.perf_counter()
    list(pool.map(_plain_chunk, chunks, [size] * cores, [1] * cores, [list(features)] * cores, [stack] * cores))
    return time.perf_counter() - t0


def plain_threads(jobs, size, cores) -> float:
    t0 = time.perf_counter()
    _plain_chunk(jobs, size, cores, [], 10)
    return time.perf_counter() - t0


def decord_run(jobs, size, cores) -> float:
    import decord

    t0 = time.perf_counter()
    for path, _, offset, count in jobs:
        vr = decord.VideoReader(path, ctx=decord.cpu(0), width=size, height=size, num_threads=cores)
        vr.get_batch(list(range(offset, offset + count))).asnumpy()
    return time.perf_counter() - t0


def torchcodec_run(jobs, size, cores) -> float:
    from torchcodec.decoders import VideoDecoder

    t0 = time.perf_counter()
    for path, _, offset, count in jobs:
        dec = VideoDecoder(path, seek_mode="exact", num_ffmpeg_threads=cores)
        dec.get_frames_at(list(range(offset, offset + count)))
    return time.perf_counter() - t0


def orchard_run(segments, index, vcfg, features, cache=None) -> float:
    """Steady-state seconds per clip x clips of the Ray Data pipeline (first batch excluded)."""
    from workloads.video.pipeline import build_dataset, consume

    ds = build_dataset(segments, features, index.paths, index.lengths, vcfg, None, cache,
                       pts=index.pts, digests=index.digests)
    columns = features or ["frames"]
    start, t0, n = time.perf_counter(), None, 0
    for batch, _ in consume(ds, 16, columns):
        if t0 is None:
            t0 = time.perf_counter()
            continue
        n += len(batch[columns[0]])
    if n == 0:   # a single batch: no steady state to time, so the whole execution counts
        return time.perf_counter() - start
    return (time.perf_counter() - t0) * len(segments) / n   # every clip at the steady-state rate


def memory_run(args) -> None:
    """Stream --times x the object store through decode + framediff; print memory figures."""
    import psutil
    import ray

    from workloads.video.dataset import scan
    from workloads.video.master import sample_segments, start_master
    from workloads.video.operator_metrics import operator_metrics
    from workloads.video.pipeline import build_dataset
    from workloads.video.synthetic_videos import generate_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = generate_dataset(f"{tmp}/videos", 4, 2, size=32, num_frames=24)
        index = scan(str(root), val_fraction=0.0)
        clip_bytes = 5 * 128 * 128 * 3
        n = int(args.times * args.store_mb * 2**20 / clip_bytes)
        segments = sample_segments(index.labels, index.lengths, list(range(len(index.paths))), n, 5, 0, 0)
        vcfg = dict(size=128, stack=4, short_rule="loop", decoder="pyav", extractor_options={},
                    pipeline_batch=16, decode_concurrency=1, decode_cpus=0.5, extract_concurrency=1,
                    extract_cpus=0.5)
        ray.init(num_cpus=args.cores, object_store_memory=int(args.store_mb * 2**20),
                 include_dashboard=False, logging_level="ERROR")
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
    print(f"Ray object store {args.store_mb} MiB, {n} clips of 5x128x128x3, {args.cores} cores")
    rows = [("decoded frames streamed (MiB)", decoded),
            ("streamed / object store", decoded / args.store_mb),
            ("Ray Data budget (MiB)", m.get("pipeline/store_limit_mb", float("nan"))),
            ("pipeline peak object-store use (MiB)", m["pipeline/store_mb_peak"]),
            ("spilled (MiB)", m["pipeline/decode_spilled_mb"] + m["pipeline/framediff_spilled_mb"]),
            ("decode backpressure (s)", m["pipeline/decode_backpressure_s"]),
            ("driver RSS growth while streaming (MiB)", (rss_peak - rss0) / 2**20)]
    for name, value in rows:
        print(f"{name:<44}{value:>12.1f}")



def stats(seconds: list[float], clips: int, count: int) -> str:
    fps = sorted(clips * count / s for s in seconds)
    cps = sorted(clips / s for s in seconds)
    return (f"{fps[0]:>7.0f} {statistics.median(fps):>7.0f} {fps[-1]:>7.0f}   "
            f"{cps[0]:>6.1f} {statistics.median(cps):>6.1f} {cps[-1]:>6.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=24, help="synthetic videos (4 classes)")
    ap.add_argument("--frames", type=int, default=64, help="frames per video")
    ap.add_argument("--clips", type=int, default=96, help="segments per measurement")
    ap.add_argument("--count", type=int, default=11, help="frames per segment (L + 1 for L = 10)")
    ap.add_argument("--size", type=int, default=112, help="frame size (pixels, square)")
    ap.add_argument("--cores", type=int, default=2, help="processes / actors / FFmpeg threads per peer")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per peer (min/median/max)")
    ap.add_argument("--memory", action="store_true", help="the bounded-memory run instead")
    ap.add_argument("--store-mb", type=float, default=100, help="--memory: Ray's object store (MiB)")
    ap.add_argument("--times", type=float, default=5, help="--memory: stream this many object stores")
    args = ap.parse_args()
    if args.memory:
        memory_run(args)
        return
    import ray

    from workloads.video.cache import make_cache
    from workloads.video.dataset import scan
    from workloads.video.master import sample_segments
    from workloads.video.synthetic_videos import generate_dataset

    print(f"load average before: {loadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = generate_dataset(f"{tmp}/videos", 4, args.videos // 4, size=args.size, num_frames=args.frames)
        index = scan(str(root), val_fraction=0.0)
        segments = sample_segments(index.labels, index.lengths, list(range(len(index.paths))), args.clips,
                                   args.count, seed=0, epoch=0)
        jobs = [(index.paths[s["video"]], index.pts[s["video"]], s["offset"], s["count"]) for s in segments]
        vcfg = dict(size=args.size, stack=args.count - 1, short_rule="loop", decoder="pyav",
                    extractor_options={"flow": {"method": "dis_medium", "bound": 20}}, pipeline_batch=8,
                    decode_concurrency=args.cores, decode_cpus=1.0, extract_concurrency=args.cores,
                    extract_cpus=0.5)
        print(f"{len(index.paths)} H.264 videos {args.size}x{args.size} (GOP 16), {args.clips} segments x "
              f"{args.count} frames, {args.cores} cores, {args.repeats} repeats")
        peers = {f"PyAV loop, {args.cores} procs x 1 thread": [],
                 f"PyAV loop, 1 proc x {args.cores} threads": [],
                 f"orchard decode, {args.cores} actors x 1 thread": []}
        optional = {"decord": decord_run, "torchcodec": torchcodec_run}
        for name in optional:
            if importlib.util.find_spec(name) is not None:
                peers[f"{name}, {args.cores} threads"] = []
        peers |= {f"PyAV loop + rgb + flow, {args.cores} procs": [], "orchard decode + rgb + flow": []}
        failed = {}
        ray.init(num_cpus=args.cores, include_dashboard=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            with ProcessPoolExecutor(args.cores) as pool:
                list(pool.map(_plain_chunk, [jobs[:1]] * args.cores, [args.size] * args.cores, [1] * args.cores,
                              [[]] * args.cores, [10] * args.cores))        # start the processes
                for _ in range(args.repeats):
                    for name, times in peers.items():
                        try:
                            if name.startswith("PyAV loop +"):
                                times.append(plain_procs(pool, jobs, args.size, args.cores, ["rgb", "flow"],
                                                         args.count - 1))
                            elif name.startswith("PyAV loop") and "procs" in name:
                                times.append(plain_procs(pool, jobs, args.size, args.cores))
                            elif name.startswith("PyAV loop"):
                                times.append(plain_threads(jobs, args.size, args.cores))
                            elif name == "orchard decode + rgb + flow":
                                times.append(orchard_run(segments, index, vcfg, ["rgb", "flow"]))
                            elif name.startswith("orchard"):
                                times.append(orchard_run(segments, index, vcfg, []))
                            else:
                                times.append(optional[name.split(",")[0]](jobs, args.size, args.cores))
                        except Exception as exc:   # a peer that installs but cannot run here
                            failed[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
            # [storage vs compute] the disk cache, cold then warm, over the same segments
            cache = make_cache("disk", f"{tmp}/cache", max_mb=4096)
            cold = orchard_run(segments, index, vcfg, ["rgb", "flow"], cache)
            warm = orchard_run(segments, index, vcfg, ["rgb", "flow"], cache)
            cached_mb = cache.total_bytes() / 2**20
        finally:
            ray.shutdown()
    print(f"load average after: {loadavg()}")
    print(f"{'peer':<44}{'frames/s min med max':>24}   {'clips/s min med max':>21}")
    for name, times in peers.items():
        if name in failed:
            print(f"{name:<44}  failed: {failed[name]}")
        elif times:
            print(f"{name:<44}{stats(times, args.clips, args.count)}")
    for name in optional:
        if importlib.util.find_spec(name) is None:
            print(f"{name + ':':<44}  not installed")
    video_mb = index.video_bytes / 2**20
    print(f"disk cache, decode + rgb + flow: cold {args.clips / cold:.1f} clips/s, warm {args.clips / warm:.1f} "
          f"clips/s ({cold / warm:.1f}x); cache holds {cached_mb:.1f} MiB for {args.clips} segments of "
          f"{video_mb:.1f} MiB of video ({cached_mb / max(video_mb, 1e-9):.1f}x)")


if __name__ == "__main__":
    main()
