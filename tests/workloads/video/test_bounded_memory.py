"""Memory stays bounded while the pipeline streams many times its object-store budget.

With ``video.object_store_mb`` the run caps what Ray Data may hold in the object
store; the decode stage must then back-pressure instead of running ahead of a
slow consumer. The clip stream here is ~12x the budget; the assertions are on
memory (Ray Data's own figures, read by the operator probe), never on time.
"""
from __future__ import annotations

import time

import pytest
import ray

from workloads.video.master import sample_segments, start_master
from workloads.video.operator_metrics import operator_metrics, pipeline_budget
from workloads.video.pipeline import build_dataset

from .conftest import pipeline_config

BUDGET_MB = 8
BLOCK_MB = 2  # one 8-clip block of 128x128x5 frames (see below)


@pytest.mark.slow
def test_pipeline_streams_12x_its_object_store_budget_in_bounded_memory(ray_session, tiny_videos):
    _, index = tiny_videos
    # 128x128 frames from 32x32 videos: 5 frames = 240 KiB per clip, 2 MiB per 8-clip block
    cfg = pipeline_config(size=128, pipeline_batch=8)
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
