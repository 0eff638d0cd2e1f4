"""bench/video_pipeline.py's sides decode the same frames: orchard's Ray Data stage and every plain
loop (processes, threads, decord where installed), with and without the rgb + flow extractors, give
the same checksums on the same segments, so the bench compares equal work."""
from __future__ import annotations

import importlib.util
from concurrent.futures import ProcessPoolExecutor

import pytest


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from bench.video_pipeline import plain_jobs
    from workloads.video.data import scan
    from workloads.video.master import sample_segments
    from workloads.video.synthetic_videos import generate_dataset

    root = generate_dataset(str(tmp_path_factory.mktemp("videos")), 4, 1, size=32, num_frames=24)
    index = scan(str(root), val_fraction=0.0)
    segments = sample_segments(index.labels, index.lengths, list(range(len(index.paths))), 6, 5, seed=0, epoch=0)
    return index, segments, plain_jobs(index, segments)


@pytest.mark.slow
def test_every_decoder_gives_orchards_frames(ray_session, clips):
    from bench import video_pipeline as vp

    index, segments, jobs = clips
    _, orchard = vp.orchard_run(segments, index, vp.pipeline_settings(32, 5, 2), [])
    with ProcessPoolExecutor(2) as pool:
        _, procs = vp.plain_procs(pool, jobs, 32, 2)
        _, to_parent = vp.plain_procs_to_parent(pool, jobs, 32)  # every clip read in this process
    _, threads = vp.plain_threads(jobs, 32, 2)
    assert orchard > 0 and orchard == procs == to_parent == threads
    if importlib.util.find_spec("decord") is not None:  # the bench extra: its own resize differs, orchard's not
        assert vp.decord_run(jobs, 32, 2, own_resize=False)[1] == orchard


@pytest.mark.slow
def test_the_extractors_on_both_sides_give_the_same_features(ray_session, clips):
    from bench import video_pipeline as vp

    index, segments, jobs = clips
    _, orchard = vp.orchard_run(segments, index, vp.pipeline_settings(32, 5, 2), ["rgb", "flow"])
    with ProcessPoolExecutor(2) as pool:
        _, procs = vp.plain_procs(pool, jobs, 32, 2, ["rgb", "flow"], 4)
    assert orchard > 0 and orchard == procs


@pytest.mark.slow
def test_a_running_pipeline_gives_each_pass_its_own_frames_from_the_same_actors(ray_session, clips):
    """The bench's orchard side (WarmPipeline): one execution, passes let through one at a time
    by the gate; every pass gives the frames a new execution gives, and the actors that decoded
    the first pass decoded the rest (their start is not any timed pass's)."""
    from bench import video_pipeline as vp

    index, segments, _ = clips
    vcfg = dict(vp.pipeline_settings(32, 5, 2), decode_cpus=0.25)
    _, cold = vp.orchard_run(segments, index, vcfg, [])
    warm = vp.WarmPipeline(segments, 3, index, vcfg, [])
    try:
        passes = [warm.run()[1] for _ in range(3)]
        assert passes == [cold] * 3
        # the pool's 2 decode actors did it all (a new execution a pass would have brought new ones)
        assert 1 <= len(ray_actors(warm)) <= 2
    finally:
        warm.close()


def ray_actors(warm) -> list:
    import ray

    return ray.get(warm.gate.actors.remote())
