"""bench/flower_strategies.py's own arithmetic: a plain-DDP side's per-step and whole-loop figures
from its ranks' records, and the rows (targets, the loop's split) built from both sides' results.
The sides themselves are orchard's flower runs (tested in tests/workloads/flower) and plain DDP."""
from __future__ import annotations

import pytest


def test_plain_ddp_ranks_summarize_as_orchards_throughput_does():
    from bench.flower_strategies import SPLIT, summarize

    ranks = [{**{k: 1.0 for k in SPLIT}, "throughput": [5.0, 10.0, 12.0], "completion_s": 4.0, "test_mae": 0.7},
             {**{k: 2.0 for k in SPLIT}, "throughput": [5.0, 11.0, 13.0, 99.0], "completion_s": 6.0}]
    got = summarize(ranks, batch=8)
    assert got["step"] == pytest.approx((21.0 + 25.0) / 2)      # summed over ranks, step 0 left out
    assert got["loop"] == pytest.approx(7 * 8 / 6.0)             # every step's images over the slowest loop
    assert got["test_mae"] == 0.7 and got["split"] == {**{k: 2.0 for k in SPLIT}, "completion_s": 6.0}  # the slowest's


def test_the_rows_hold_ring_to_plain_ddp_and_ps_to_ring(monkeypatch):
    from bench import flower_strategies as fs

    split = {"completion_s": 9.0, "loop_start_s": 1.0, "steps_s": 6.0, "checkpoint_s": 0.5}
    monkeypatch.setattr(fs, "prepare_tiles_once", lambda size, out: ([], {"train_idx": list(range(64)),
                                                                         "batch_size": 8, "epochs": 2}))
    monkeypatch.setattr(fs, "run_plain_ddp", lambda world, setup: {"step": 100.0 * world, "loop": 90.0 * world,
                                                                   "test_mae": 0.6, "split": split})
    monkeypatch.setattr(fs, "run_orchard", lambda overrides, n, batch, epochs, world: {
        "step": 98.0 * world, "loop": 89.0 * world, "test_mae": 0.5, "blob_mae": 1.2,
        "split": {**split, "comm_wait_s": 2.0} if "strategy=ps" in overrides else split})
    rows = {r["name"]: r for r in fs.measure(fs.SIZES["full"], 3)}
    ring = rows["ring vs plain DDP, 2 workers, whole loop"]
    assert ring["target"]["min_ratio"] == 0.98 and ring["orchard"]["values"] == [178.0] * 3
    assert ring["quality"]["orchard"]["loop s = start + steps + checkpoints + rest"] == "9.0 = 1.0 + 6.0 + 0.5 + 1.5"
    assert rows["ring vs plain DDP, 1 worker, per step"]["target"]["min_ratio"] == 0.95
    ps = rows["ps-sync vs ring, 2 workers, per step"]
    assert ps["target"]["min_ratio"] == 0.9 and "network waits 2.0" in ps["quality"]["orchard"]["loop s = start + steps + checkpoints + rest"]
    assert rows["orchard ring: 2 workers vs 1, whole loop (speed-up)"]["peer"]["values"] == [89.0] * 3
    assert {"test MAE": 0.5, "blob counter MAE": 1.2} == rows["ps-async vs plain DDP, 1 worker, per step"]["quality"]["orchard"]
