"""workload=video pipeline benchmark: plain PyAV loop vs the Ray Data decode stage, and the
full rgb+flow pipeline with and without the cache, on the same files and cores.

    .venv/bin/python bench/video_pipeline.py [--videos 24] [--clips 192] [--size 112] [--cores 2]

Prints frames/s of a single-process PyAV decode loop next to the Ray Data decode stage
(an actor pool of --cores actors, steady state: actor start-up excluded) and the ratio stage / (loop x cores) (issue 5's target:
>= 0.8), then the rgb+flow pipeline's clips/s with cache=none, and cache=memory cold
and warm (second pass over the same segments). Takes ~2 min on 2 idle cores.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=24, help="synthetic videos (4 classes)")
    ap.add_argument("--frames", type=int, default=64, help="frames per video")
    ap.add_argument("--clips", type=int, default=192, help="segments decoded per measurement")
    ap.add_argument("--count", type=int, default=11, help="frames per segment (L + 1 for L = 10)")
    ap.add_argument("--size", type=int, default=112, help="frame size (pixels, square)")
    ap.add_argument("--cores", type=int, default=2, help="CPUs given to Ray and decode actors")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
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
