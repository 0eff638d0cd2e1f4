"""The master: class-balanced, seeded segment sampling and start/stop/pause/resume of decoding."""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from workloads.video.master import evenly_spaced_segments, sample_segments

from .conftest import pipeline_config

# 3 classes with very unequal video counts: a per-video sampler would be 10:2:1.
LABELS = [0] * 10 + [1] * 2 + [2] * 1
LENGTHS = [40] * 12 + [5]


def test_classes_are_balanced_even_when_videos_are_not():
    segs = sample_segments(LABELS, LENGTHS, list(range(13)), 3000, frame_count=8, seed=1, epoch=0)
    per_class = Counter(s["label"] for s in segs)
    for c in range(3):
        assert abs(per_class[c] / 3000 - 1 / 3) < 0.04, per_class
    assert all(LABELS[s["video"]] == s["label"] for s in segs)


def test_offsets_stay_inside_the_video_and_on_the_grid():
    segs = sample_segments(LABELS, LENGTHS, list(range(13)), 500, frame_count=8, seed=1, epoch=0,
                           offset_stride=4)
    for s in segs:
        assert s["count"] == 8
        assert s["offset"] % 4 == 0
        assert 0 <= s["offset"] <= max(0, LENGTHS[s["video"]] - 8)
    # the 5-frame video is shorter than the request: always offset 0 (the short rule loops it)
    assert {s["offset"] for s in segs if s["video"] == 12} <= {0}


def test_same_seed_same_epoch_same_sequence_and_new_epoch_new_sequence():
    a = sample_segments(LABELS, LENGTHS, list(range(13)), 200, 8, seed=5, epoch=2)
    b = sample_segments(LABELS, LENGTHS, list(range(13)), 200, 8, seed=5, epoch=2)
    c = sample_segments(LABELS, LENGTHS, list(range(13)), 200, 8, seed=5, epoch=3)
    d = sample_segments(LABELS, LENGTHS, list(range(13)), 200, 8, seed=6, epoch=2)
    assert a == b
    assert a != c and a != d


def test_evenly_spaced_validation_segments_cover_the_video():
    segs = evenly_spaced_segments([0, 1], [40, 40], [0, 1], per_video=5, frame_count=8)
    assert [s["offset"] for s in segs if s["video"] == 0] == [0, 8, 16, 24, 32]
    assert [s["segment"] for s in segs if s["video"] == 1] == [0, 1, 2, 3, 4]


def _run_pipeline(segs, index, master, out: list):
    from workloads.video.pipeline import build_dataset, consume

    ds = build_dataset(segs, ["rgb"], index.paths, index.lengths, pipeline_config(), master=master)
    for batch, _ in consume(ds, 4, ["rgb", "label"]):
        out.append(len(batch["label"]))


@pytest.mark.slow
def test_pause_blocks_decoding_until_resume(ray_session, tiny_videos):
    import ray

    from workloads.video.master import start_master

    _, index = tiny_videos
    master = start_master(index.labels, index.lengths, seed=0)
    segs = ray.get(master.epoch_segments.remote(index.subset("train"), 12, 5, 0))
    assert ray.get(master.pause.remote()) == "paused"
    got: list[int] = []
    worker = threading.Thread(target=_run_pipeline, args=(segs, index, master, got), daemon=True)
    worker.start()
    # wait (bounded) until the paused master holds a release back
    deadline = time.monotonic() + 180
    while ray.get(master.held_releases.remote()) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.get(master.held_releases.remote()) >= 1
    assert sum(got) == 0
    assert "decode" not in ray.get(master.stage_stats.remote())   # nothing decoded while paused
    assert ray.get(master.resume.remote()) == "running"
    worker.join(timeout=300)
    assert not worker.is_alive()
    assert sum(got) == 12
    assert ray.get(master.stage_stats.remote())["decode"]["items"] == 12


@pytest.mark.slow
def test_a_pause_longer_than_ray_datas_scale_down_delay_shrinks_the_grown_decode_pool(ray_session, tiny_videos):
    """The elastic decode pool (min 1, max 2) grows while seeds queue; a pause holds the seeds back
    at the master, before the decode stage, so the pool runs dry and Ray Data shrinks it. Ray Data
    shrinks a pool only once 10 s have passed since it last grew (its actor pool's scale-down
    debounce, ``_ACTOR_POOL_SCALE_DOWN_DEBOUNCE_PERIOD_S`` in ray.data 2.60, not configurable), so
    the pause here lasts 12 s. In a run the pauses come when the trainers fall behind, and whether
    one outlasts that delay is the run's timing: the end-to-end test
    (test_run.py::test_decode_is_elastic_end_to_end...) failed half its runs here on that once the
    trainers' steady state outpaced decoding (2026-12-04), so the shrink is proven here."""
    import ray

    from workloads.video.master import start_master
    from workloads.video.operator_metrics import operator_metrics, operator_summaries
    from workloads.video.pipeline import build_dataset, consume

    _, index = tiny_videos
    master = start_master(index.labels, index.lengths, seed=0)
    segs = ray.get(master.epoch_segments.remote(index.subset("train"), 96, 5, 0))
    ds = build_dataset(segs, ["rgb"], index.paths, index.lengths,
                       pipeline_config(decode_concurrency=[1, 2]), master=master)
    got, paused = 0, False
    for batch, _ in consume(ds, 4, ["rgb", "label"]):
        got += len(batch["label"])
        if not paused:  # the seeds queued behind the first batch have grown the pool
            assert ray.get(master.pause.remote()) == "paused"
            time.sleep(12)
            assert ray.get(master.resume.remote()) == "running"
            paused = True
    m = operator_metrics(operator_summaries(master))
    assert got == 96                                       # resumed: every segment decoded
    assert m["pipeline/decode_pool_actors_peak"] == 2, m   # grew to its max
    assert m["pipeline/decode_pool_scale_downs"] >= 1, m   # and shrank in the pause


@pytest.mark.slow
def test_stop_drops_the_remaining_work_without_failing(ray_session, tiny_videos):
    import ray

    from workloads.video.master import start_master

    _, index = tiny_videos
    master = start_master(index.labels, index.lengths, seed=0)
    segs = ray.get(master.epoch_segments.remote(index.subset("train"), 8, 5, 0))
    ray.get(master.stop.remote())
    got: list[int] = []
    _run_pipeline(segs, index, master, got)
    assert sum(got) == 0
    assert ray.get(master.state.remote()) == "stopped"
    ray.get(master.start.remote())
    got.clear()
    _run_pipeline(segs, index, master, got)
    assert sum(got) == 8


def test_sampler_refuses_an_empty_video_list():
    with pytest.raises(ValueError):
        sample_segments([], [], [], 1, 8, 0, 0)


def test_a_pause_and_resume_that_arrive_swapped_leave_decoding_running():
    """Ray runs an async actor's calls in any order: the feeder numbers its pauses and resumes,
    and the master drops one older than what it applied (a resume overtaken by its pause had left
    decoding paused and the trainers waiting on it), and every one after a stop. Unnumbered calls
    apply as they come."""
    import asyncio

    from workloads.video.master import Master

    async def scenario():
        master = Master([0, 1], [10, 10], seed=0)
        assert await master.pause(1) == "paused"
        assert await master.resume(3) == "running"      # sent after the pause numbered 2 ...
        assert await master.pause(2) == "running"       # ... which arrives late: dropped
        assert await master.pause(4) == "paused"        # the next pause applies
        assert await master.resume() == "running"       # unnumbered (tests, a user): as it comes
        await master.stop()                              # the feeder's pauses end with a stop:
        assert await master.start() == "running"         # a late one cannot pause the decoding
        assert await master.pause(5) == "running"        # that inference starts next
        return master._resumed.is_set()

    assert asyncio.run(scenario())


def test_blocks_are_let_in_in_their_datasets_order_however_their_gate_tasks_arrive():
    """Several gate tasks run at once (pipeline.build_dataset), so a later block may reach the
    master first: it waits until the blocks before it are let in, and takes no window room ahead
    of them (a later block let in first would wait undecoded for the earlier one in the ordered
    dataset while holding the window the earlier one waits on: runs hung so). A block already
    let in (a retried gate task) goes in again at once, without taking window room a second time
    (its seeds are decoded once); a stop drops what waits."""
    import asyncio

    from workloads.video.master import Master

    async def scenario():
        master = Master([0, 1], [10, 10], seed=0)
        order = []

        async def gate(first, n, window=8):
            ok = await master.release("f", n, window, first)
            order.append((first, ok))

        later = asyncio.create_task(gate(4, 4))
        latest = asyncio.create_task(gate(8, 4))
        await asyncio.sleep(0.05)
        assert order == []                          # 4 and 8 wait for block 0 ...
        await gate(0, 4)
        await asyncio.sleep(0.05)
        assert order == [(0, True), (4, True)]      # ... then go in its order; 8 waits for room
        await asyncio.wait_for(gate(4, 4), 5)       # a retried block 4: in at once, the window full
        await master.decoded("f", 4)
        await asyncio.sleep(0.05)
        assert order[-1] == (8, True)               # room for 8 once 0 is decoded: 4 counted once
        waiting = asyncio.create_task(gate(20, 4))
        await asyncio.sleep(0.05)
        await master.stop()
        await asyncio.gather(later, latest, waiting)
        return order

    assert asyncio.run(scenario())[-1] == (20, False)
