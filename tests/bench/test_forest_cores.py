"""bench/forest_cores.py (issue 48): the forest's phase-2 counting (sparse, dense) and a register loop in N
plain processes at once, each with the same work; a row per kind and count with the machine's
speed-up N x t(1) / t(N). Real spawned processes at the smoke size (1 and 2 processes)."""
from __future__ import annotations

import pytest


def test_counts_are_the_forest_rows_or_the_ones_asked():
    from bench.forest_cores import core_counts

    assert core_counts(16) == [1, 4, 16] and core_counts(2) == [1, 2] and core_counts(2, [1, 2, 4]) == [1, 2]


def test_both_countings_make_the_same_two_slices_of_every_example_feature():
    import numpy as np

    from bench.forest_cores import SIZES, phase2_work
    from workloads.forest.shuffle import add_partial

    size = SIZES["smoke"]
    hists = []
    for sparse in (True, False):
        halves = []
        for p in phase2_work(size, 0, sparse)():
            halves.append(np.zeros(tuple(p["shape"]), np.int64))
            add_partial(halves[-1], 0, p)
        hists.append(np.concatenate(halves))
    assert hists[0].shape == (size["columns"], size["features"], size["bins"])
    assert hists[0].sum() == size["examples"] * size["features"]   # one count per example and feature
    assert np.array_equal(*hists)


@pytest.mark.slow
def test_rows_give_each_kind_its_speed_up_at_two_processes():
    from bench.forest_cores import KINDS, SIZES, measure

    rows = measure(SIZES["smoke"], 1)
    assert [r["name"] for r in rows] == [f"forest kernel, {k}: 2 processes vs 1 (same work each)" for k in KINDS]
    for r in rows:
        q = r["quality"]["orchard"]
        assert q["processes"] == 2 and q["speed-up"] > 0
        assert q["efficiency"] == pytest.approx(r["peer"]["values"][0] / r["orchard"]["values"][0], rel=1e-2)
