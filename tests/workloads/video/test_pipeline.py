"""workloads/video/pipeline.py: a file that breaks after the scan is skipped by the decode stage, not the end of the
run; memory stays bounded while the pipeline streams many times its object-store budget."""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import ray

from workloads.video.master import sample_segments, start_master
from workloads.video.operator_metrics import operator_metrics, pipeline_budget
from workloads.video.pipeline import build_dataset

from .conftest import pipeline_config


@pytest.mark.slow
def test_a_file_that_breaks_after_the_scan_is_skipped_by_the_decode_stage(tmp_path, tiny_videos, ray_session):
    """The pipeline never stops for one bad file: the segment is dropped, counted and named."""
    import ray

    from workloads.video.master import start_master
    from workloads.video.pipeline import build_dataset, consume

    _, index = tiny_videos
    paths = [str(tmp_path / f"v{i}.mp4") for i in range(3)]
    for src, dst in zip(index.paths[:3], paths):
        Path(dst).write_bytes(Path(src).read_bytes())
    master = start_master([0, 1, 2], [24, 24, 24], seed=0)
    Path(paths[1]).write_bytes(Path(paths[1]).read_bytes()[:300])   # truncated after indexing
    segs = [{"video": v, "label": v, "offset": 2, "count": 5} for v in (0, 1, 2, 0, 1, 2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = build_dataset(segs, ["rgb"], paths, [24, 24, 24], pipeline_config(), master=master)
    # the gate's tasks kept on the master's node by a named parameter, not Ray Data's deprecated
    # ray_remote_args (removed in Ray 2.64; orchard.api.on_this_node)
    assert not [w for w in caught if "ray_remote_args" in str(w.message)], [str(w.message) for w in caught]
    labels = np.concatenate([b["label"] for b, _ in consume(ds, 8, ["label"])])
    assert sorted(labels.tolist()) == [0, 0, 2, 2]
    assert list(ray.get(master.bad_files.remote())) == [paths[1]]
    assert ray.get(master.stage_stats.remote())["decode"]["bad"] == 2


BUDGET_MB = 8


BLOCK_MB = 2  # one 8-clip block of 128x128x5 frames (see below)


@pytest.mark.slow
def test_pipeline_streams_12x_its_object_store_budget_in_bounded_memory(ray_session, tiny_videos):
    """With ``video.object_store_mb`` the run caps what Ray Data may hold in the object store; the
    decode stage must then back-pressure instead of running ahead of a slow consumer. The clip
    stream here is ~12x the budget; the assertions are on memory (Ray Data's own figures, read by
    the operator probe), never on time."""
    _, index = tiny_videos
    # 128x128 frames from 32x32 videos: 5 frames = 240 KiB per clip, 2 MiB per 8-clip block
    # the stages apart (not fused into the decode actor): the frames themselves cross the store
    cfg = pipeline_config(size=128, pipeline_batch=8, fuse_extract=False)
    segments = sample_segments(index.labels, index.lengths, index.subset("train"), 400, 5, seed=0, epoch=0)
    master = start_master(index.labels, index.lengths, seed=0)
    with pipeline_budget(BUDGET_MB):
        ds = build_dataset(segments, ["framediff"], index.paths, index.lengths, cfg, master)
        rows = 0
        for batch in ds.iter_batches(batch_size=8, batch_format="numpy"):
            rows += len(batch["framediff"])
            time.sleep(0.02)   # a consumer slower than decoding: unbounded, the queues would grow
    assert rows == len(segments)
    decoded_mb = ray.get(master.stage_stats.remote())["decode"]["bytes"] / 2**20
    for _ in range(50):        # the probe's summary is a fire-and-forget call at the end of execution
        summaries = ray.get(master.operator_summaries.remote())
        if summaries:
            break
        time.sleep(0.1)
    m = operator_metrics(summaries)
    assert decoded_mb >= 10 * BUDGET_MB                      # the stream is many budgets long
    assert m["pipeline/store_limit_mb"] == BUDGET_MB         # the knob reached the executor
    # ... and bounded what it held. Ray Data checks the budget before it launches a task, so
    # one task's output block (2 MiB here) can land on top of a full budget.
    assert 0 < m["pipeline/store_mb_peak"] <= BUDGET_MB + BLOCK_MB
    assert m["pipeline/decode_spilled_mb"] == 0 and m["pipeline/framediff_spilled_mb"] == 0
    assert m["pipeline/decode_backpressure_s"] > 0           # decoding was held back, not buffered


def test_blocks_hold_pipeline_batch_clips_but_leave_every_decode_actor_two_and_stay_under_128_mib():
    from workloads.video.pipeline import block_size

    cfg = pipeline_config(pipeline_batch=256, decode_concurrency=[1, 2])
    assert block_size(1000, cfg, 11) == 250             # a pass of 1000: two blocks for each of 2 actors
    assert block_size(5000, cfg, 11) == 256
    assert block_size(40, cfg, 11) == 10
    assert block_size(1, pipeline_config(decode_concurrency=4), 11) == 1
    # 11 frames of 224x224 RGB are 1.58 MiB: 81 of them fit Ray Data's 128 MiB target block
    assert block_size(5000, dict(cfg, size=224), 11) == 81


def test_extractors_run_inside_the_decode_actors_when_the_cache_is_off_unless_told():
    from workloads.video.cache import FeatureCache
    from workloads.video.pipeline import fused

    off, on = FeatureCache("none"), FeatureCache("disk", "/nonexistent")
    assert fused(pipeline_config(), None) and fused(pipeline_config(), off)
    assert not fused(pipeline_config(), on)               # a cached feature skips its own pool's work
    assert fused(pipeline_config(fuse_extract=True), on) and not fused(pipeline_config(fuse_extract=False), off)
