"""workload=video's decode stage on more cores (issue 51): orchard against the plain loops at 2, 4,
8, 16, ... cores, on the cores alone, for a lent many-core machine.

    python -m bench video_cores      # on 2 idle cores ~1 min (the 2-core rows); on 16 over 6 min

What is compared, at each core count N (2, 4, 8, ... up to the machine's cores, and its own count):
the same sides as `python -m bench video` (bench/video_pipeline.py says why they are fair), on two
sets of clips that grow with N so that a pass lasts about as long at every N:
- clips that share no frame (two a video, end to end: a UCF101 epoch's case): orchard's decode
  stage (N actors x 1 FFmpeg thread, a running pipeline) against the plain PyAV loop in N
  processes keeping its frames, and the same loop handing every clip to its parent;
- overlapping clips (40 a 64-frame video, as the main bench's 960): orchard against the N-process
  loop and decord with N threads.
The same cores, not only the same count: the bench process is pinned to N of the machine's cores
(``os.sched_setaffinity``) before it starts Ray and the loop's process pool, so Ray's processes,
the driver, the decode actors and the loop's processes all inherit those N cores, and nothing of
either side runs on the others. One untimed warm-up pass of every side at each N, then the sides
alternate within each repeat; every side timed wall to wall; checksums of every decoded pixel
compared with orchard's. Each row's quality carries each side's speed-up from the first N, which
docs/scaling.md's video model (independent clips: N x one core's rate) is checked against.
Each count is kept as it ends (bench/journal.py): a bench stopped in a later count still gives the
rows of the counts before it (``python -m bench --from-runs``).
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor

# per core: lone videos (two clips each, end to end) and overlapping videos (40 clips each)
SIZES = {"full": {"lone_videos_per_core": 48, "videos_per_core": 6, "frames": 64, "count": 11, "size": 112,
                  "cores": None},
         "smoke": {"lone_videos_per_core": 4, "videos_per_core": 1, "frames": 24, "count": 5, "size": 32,
                   "cores": [1, 2]}}
ESTIMATE = "~1 min on 2 idle cores (51 s, 2026-12-03); over 6 min on 16 (2026-12-04: its clips, then 2, 4 and 8 cores took ~370 s)"
CLIPS_PER_VIDEO = 40


def core_counts(cores: int, wanted: list[int] | None = None) -> list[int]:
    """2, 4, 8, ... up to ``cores``, and ``cores`` itself (``wanted``: these, where the cores exist)."""
    counts = wanted or [n for n in (2, 4, 8, 16, 32, 64, 128) if n <= cores] + [cores]
    return sorted({n for n in counts if 1 <= n <= cores})


def clip_sets(tmp: str, size: dict, most: int) -> dict:
    """``{set: index}``: the videos of each set for the largest core count (``segments_at`` takes a share)."""
    from workloads.video.data import scan
    from workloads.video.synthetic_videos import generate_dataset

    count, px = size["count"], size["size"]
    return {"lone": scan(str(generate_dataset(f"{tmp}/lone", 4, max(1, size["lone_videos_per_core"] * most // 4),
                                              size=px, num_frames=2 * count)), val_fraction=0.0),
            "overlap": scan(str(generate_dataset(f"{tmp}/videos", 2, max(1, size["videos_per_core"] * most // 2),
                                                 size=px, num_frames=size["frames"])), val_fraction=0.0)}


def segments_at(n: int, most: int, sets: dict, count: int) -> dict:
    """``{set: segments}`` for N cores: the clips of N/most of each set's videos (every most-th
    video from N on left out, so the classes stay mixed), a pass as long at every N."""
    from bench.video_pipeline import lone_clips
    from workloads.video.master import sample_segments

    out = {}
    for name, index in sets.items():
        videos = [v for v in range(len(index.paths)) if v % most < n]
        if name == "lone":   # two clips a video, end to end, shuffled
            out[name] = lone_clips(index, videos, count)
        else:                # 40 clips a video, overlapping, as the main bench's 960
            out[name] = sample_segments(index.labels, index.lengths, videos, CLIPS_PER_VIDEO * len(videos), count,
                                        seed=0, epoch=0)
    return out


def at_cores(n: int, cpus: list[int], sets: dict, size: dict, repeats: int) -> dict:
    """``{side: [(seconds, checksum) per repeat]}`` with this process pinned to ``cpus[:n]``."""
    import ray

    from bench.machine import start_ray
    from bench.video_pipeline import (WarmPipeline, decord_run, pipeline_settings, plain_jobs, plain_procs,
                                      plain_procs_to_parent)

    # this (main) thread's mask: every process and thread started from it below inherits it (Ray's
    # raylet, GCS and workers, Ray Data's executor thread, the pool's processes, decord's threads)
    os.sched_setaffinity(0, cpus[:n])
    px = size["size"]
    vcfg = pipeline_settings(px, size["count"], n)
    share = round(n / (2 * n + 1), 3)   # two running pipelines' actors fit N CPUs (a reservation, not a limit)
    vcfg = dict(vcfg, decode_cpus=share, extract_cpus=share)
    take = segments_at(n, len(cpus), sets, size["count"])
    jobs = {name: plain_jobs(sets[name], take[name]) for name in sets}
    start_ray(num_cpus=n)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        warm = {name: WarmPipeline(take[name], 1 + repeats, sets[name], vcfg, []) for name in sets}
        with ProcessPoolExecutor(n) as pool:
            sides = {"orchard lone": warm["lone"].run,
                     "procs lone": lambda: plain_procs(pool, jobs["lone"], px, n),
                     "procs lone to parent": lambda: plain_procs_to_parent(pool, jobs["lone"], px),
                     "orchard": warm["overlap"].run,
                     "procs": lambda: plain_procs(pool, jobs["overlap"], px, n)}
            if importlib.util.find_spec("decord") is not None:
                sides["decord"] = lambda: decord_run(jobs["overlap"], px, n)
            for fn in sides.values():   # the untimed warm-up of every side
                fn()
            got = {name: [] for name in sides}
            for _ in range(repeats):
                for name, fn in sides.items():
                    got[name].append(fn())
                    print(f"  video_cores: {n} cores: {name}: {got[name][-1][0]:.2f} s", flush=True)
        for w in warm.values():
            w.close()
    finally:
        ray.shutdown()
        os.sched_setaffinity(0, cpus)
    got["frames"] = {name: len(segments) * size["count"] for name, segments in take.items()}
    return got


def measure(size: dict, repeats: int) -> list[dict]:
    from bench import journal
    from orchard import cluster

    cpus = sorted(os.sched_getaffinity(0))
    counts = core_counts(len(cpus), size["cores"])
    cluster.prepare_local_env()   # Ray workers import workloads/ from this checkout
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        sets = clip_sets(tmp, size, counts[-1])
        for n in counts:
            measured.append((n, at_cores(n, cpus, sets, size, repeats)))
            # kept the moment a count ends (bench/journal.py): on 2026-12-04 a lent machine's call
            # ended in the 16-core count and took the 2, 4 and 8 cores' passes with it
            journal.add({"cores": n}, measured[-1][1])
    return assemble(measured)


def rows_from_runs(size: dict, cores: int, runs: list[dict]) -> list[dict]:
    """The rows of the core counts a journal kept (bench/journal.py): a bench stopped in a count
    has the rows of the counts before it."""
    return assemble([(r["key"]["cores"], r["run"]) for r in runs if "run" in r])


def assemble(measured: list[tuple[int, dict]]) -> list[dict]:
    """The rows of ``at_cores``' passes, one ``(cores, passes)`` a count in the order run: orchard
    against each peer at each count, speed-ups from the first count."""
    from bench.rows import row

    labels = {"procs lone": "PyAV loop, N processes x 1 thread", "procs": "PyAV loop, N processes x 1 thread",
              "procs lone to parent": "PyAV loop, N processes x 1 thread, every clip handed to the parent",
              "decord": "decord, N threads, its own resize"}
    pairs = [("lone", "orchard lone", "procs lone"), ("lone", "orchard lone", "procs lone to parent"),
             ("overlap", "orchard", "procs"), ("overlap", "orchard", "decord")]
    titles = {"lone": "decode clips that share no frame (2 a video)", "overlap": "decode overlapping clips (40 a video)"}
    rows, first = [], {}
    for n, got in measured:
        fps = {side: [got["frames"][s] / t for t, _ in got[side]]
               for s, *sides in pairs for side in sides if side in got}
        for side, values in fps.items():
            first.setdefault(side, (n, statistics.median(values)))

        def scaled(side):  # this side's speed-up from the first core count, and per core
            n0, base = first[side]
            up = statistics.median(fps[side]) / base
            return {"cores": n, f"speed-up from {n0} cores": round(up, 3),
                    "efficiency": round(up * n0 / n, 3)}

        for s, mine, peer in pairs:
            if peer not in got:
                continue
            same = got[peer][-1][1] == got[mine][-1][1]
            rows.append(row(f"{titles[s]}, {n} cores: orchard vs {labels[peer].replace('N ', f'{n} ')}",
                            "frames/s", fps[mine], fps[peer], higher_is_better=True,
                            orchard_label=f"Ray Data decode stage, {n} actors x 1 thread, running pipeline",
                            peer_label=labels[peer].replace("N ", f"{n} "),
                            quality={"orchard": {**scaled(mine), "frames": got["frames"][s]},
                                     "peer": {**scaled(peer), "checksum": "equal to orchard's" if same else
                                              f"DIFFERS ({got[peer][-1][1]} vs {got[mine][-1][1]})"}},
                            target={"text": f"orchard's decode stage >= 1.0x the peer on {n} cores",
                                    "min_ratio": 1.0, "quality_ok": same}))
    return rows
