"""workload=video pipeline benchmark: plain PyAV loop vs the Ray Data decode stage, and the
full rgb+flow pipeline with and without the cache, on the same files and cores.

    .venv/bin/python bench/video_pipeline.py [--videos 24] [--clips 192] [--size 112] [--cores 2]

Prints frames/s of a single-process PyAV decode loop next to the Ray Data decode stage
(an actor pool of --cores actors, steady state: actor start-up excluded) and the ratio stage / (loop x cores) (issue 5's target:
>= 0.8), then the rgb+flow pipeline's clips/s with cache=none, and cache=memory cold
and warm (second pass over the same segments). Takes ~2 min on 2 idle cores.

    .venv/bin/python bench/video_pipeline.py --memory [--store-mb 100] [--times 5]

instead streams decoded clips (decode + framediff, 128x128) totalling --times x the
object store of a Ray started with --store-mb MiB of object store, to a consumer
slower than decoding, and prints the pipeline's peak object-store use, spilled
bytes and the driver's RSS growth (issue 5, must-have 9: bounded memory).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time


def plain_loop(segments, paths, lengths, size) -> float:
    """Frames/s of the simplest correct decoder: one process, one clip after another."""
    from workloads.video.decoder import PyAVDecoder

    dec = PyAVDecoder(size=size)
    t0 = time.perf_counter()
    frames = sum(len(dec.decode(paths[s["video"]], s["offset"], s["count"], lengths[s["video"]])) for s in segments)
    return frames / (time.perf_counter() - t0)


def ray_pipeline(segments, paths, lengths, vcfg, features, cache=None) -> tuple[float, float]:
    """(items/s, frames/s) of the Ray Data pipeline consumed on the driver, in steady state.

    The clock starts when the first batch arrives: starting the actor pools (a few
    seconds, paid once per dataset execution) is not decode throughput. Rows of the
    first batch are not counted.
    """
    from workloads.video.pipeline import build_dataset, consume

    ds = build_dataset(segments, features, paths, lengths, vcfg, master=None, cache=cache)
    columns = features or ["frames"]
    t0, n = None, 0
    for batch, _ in consume(ds, 16, columns):
        if t0 is None:
            t0 = time.perf_counter()
            continue
        n += len(batch[columns[0]])
    wall = time.perf_counter() - t0
    return n / wall, n * segments[0]["count"] / wall


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
            for _ in build_dataset(segments, ["framediff"], index.paths, index.lengths, vcfg, master
                                   ).iter_batches(batch_size=16, batch_format="numpy"):
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=24, help="synthetic videos (4 classes)")
    ap.add_argument("--frames", type=int, default=64, help="frames per video")
    ap.add_argument("--clips", type=int, default=192, help="segments decoded per measurement")
    ap.add_argument("--count", type=int, default=11, help="frames per segment (L + 1 for L = 10)")
    ap.add_argument("--size", type=int, default=112, help="frame size (pixels, square)")
    ap.add_argument("--cores", type=int, default=2, help="CPUs given to Ray and decode actors")
    ap.add_argument("--memory", action="store_true", help="the bounded-memory run instead")
    ap.add_argument("--store-mb", type=float, default=100, help="--memory: Ray's object store (MiB)")
    ap.add_argument("--times", type=float, default=5, help="--memory: stream this many object stores")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.memory:
        memory_run(args)
        return
    import ray

    from workloads.video.cache import make_cache
    from workloads.video.dataset import scan
    from workloads.video.master import sample_segments
    from workloads.video.synthetic_videos import generate_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = generate_dataset(f"{tmp}/videos", 4, args.videos // 4, size=args.size, num_frames=args.frames)
        index = scan(str(root), val_fraction=0.0)
        ids = list(range(len(index.paths)))
        segments = sample_segments(index.labels, index.lengths, ids, args.clips, args.count, seed=0, epoch=0)
        vcfg = dict(size=args.size, stack=args.count - 1, short_rule="loop", decoder="pyav",
                    extractor_options={"flow": {"method": "dis_medium", "bound": 20}}, pipeline_batch=16,
                    decode_concurrency=args.cores, decode_cpus=1.0, extract_concurrency=[1, args.cores],
                    extract_cpus=0.5)
        print(f"{len(index.paths)} H.264 videos {args.size}x{args.size}, {args.clips} segments x {args.count} "
              f"frames, {args.cores} cores")
        loop_fps = plain_loop(segments, index.paths, index.lengths, args.size)
        ray.init(num_cpus=args.cores, include_dashboard=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            _, stage_fps = ray_pipeline(segments, index.paths, index.lengths, vcfg, [])
            full = dict(vcfg, decode_concurrency=[1, args.cores], decode_cpus=0.5)
            none_cps, _ = ray_pipeline(segments, index.paths, index.lengths, full, ["rgb", "flow"])
            cache = make_cache("memory", tmp, max_mb=2048)
            cold_cps, _ = ray_pipeline(segments, index.paths, index.lengths, full, ["rgb", "flow"], cache)
            warm_cps, _ = ray_pipeline(segments, index.paths, index.lengths, full, ["rgb", "flow"], cache)
            cached_mb = cache.total_bytes() / 2**20
        finally:
            ray.shutdown()
    print(f"{'measurement':<44}{'value':>12}")
    print(f"{'plain PyAV loop, 1 process (frames/s)':<44}{loop_fps:>12.0f}")
    print(f"{f'Ray Data decode stage, {args.cores} actors (frames/s)':<44}{stage_fps:>12.0f}")
    print(f"{'ratio stage / (loop x cores)':<44}{stage_fps / (loop_fps * args.cores):>12.2f}")
    print(f"{'rgb+flow pipeline, cache=none (clips/s)':<44}{none_cps:>12.1f}")
    print(f"{'rgb+flow pipeline, cache=memory cold (clips/s)':<44}{cold_cps:>12.1f}")
    print(f"{'rgb+flow pipeline, cache=memory warm (clips/s)':<44}{warm_cps:>12.1f}")
    print(f"{'warm cache / no cache':<44}{warm_cps / none_cps:>12.2f}")
    print(f"{'cache size (MiB) for the segments':<44}{cached_mb:>12.1f}")


if __name__ == "__main__":
    main()
