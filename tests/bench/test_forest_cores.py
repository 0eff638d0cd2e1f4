"""bench/forest_cores.py (issue 48): the forest's phase-2 task body and a register loop in N
plain processes at once, each with the same work; a row per kind and count with the machine's
speed-up N x t(1) / t(N). Real spawned processes at the smoke size (1 and 2 processes)."""
from __future__ import annotations

import pytest


def test_counts_double_up_to_the_cores_or_take_the_ones_asked():
    from bench.forest_cores import core_counts

    assert core_counts(16) == [1, 2, 4, 8, 16] and core_counts(2, [1, 2, 4]) == [1, 2]


def test_the_task_body_counts_every_example_feature_and_encodes_two_slices():
    import numpy as np

    from bench.forest_cores import SIZES, phase2_work
    from workloads.forest.shuffle import add_partial

    size = SIZES["smoke"]
    parts = phase2_work(size, 0)()
    halves = [np.zeros(tuple(p["shape"]), np.int64) for p in parts]
    for half, p in zip(halves, parts):
        add_partial(half, 0, p)
    hist = np.concatenate(halves)
    assert hist.shape == (size["columns"], size["features"], size["bins"])
    assert hist.sum() == size["examples"] * size["features"]   # one count per example and feature


@pytest.mark.slow
def test_rows_give_each_kind_its_speed_up_at_two_processes():
    from bench.forest_cores import KINDS, SIZES, measure

    rows = measure(SIZES["smoke"], 1)
    assert [r["name"] for r in rows] == [f"forest kernel, {k}: 2 processes vs 1 (same work each)" for k in KINDS]
    for r in rows:
        q = r["quality"]["orchard"]
        assert q["processes"] == 2 and q["speed-up"] > 0
        assert q["efficiency"] == pytest.approx(r["peer"]["values"][0] / r["orchard"]["values"][0], rel=1e-2)
