"""bench/flower_jpeg.py at smoke size: both sides train the workload's model (with the shipped
degradations, and without: ``augment=None``) and count the same unseen field as PNG and as JPEG;
the row holds one gap per seed and side, the PNG counts beside them, and an orchard-only target.
Its figures are never asserted: they are what the full bench measures."""
from __future__ import annotations

import math

import pytest


@pytest.mark.slow  # 9 s: two trainings and their counts; CI runs it, the quick loop does not
def test_the_smoke_bench_trains_both_sides_and_reports_each_seeds_jpeg_gap():
    from bench import flower_jpeg

    (row,) = flower_jpeg.measure(flower_jpeg.SIZES["smoke"], repeats=1)
    assert row["unit"] == "%" and not row["higher_is_better"]
    assert "augment=null" in row["peer"]["label"]
    for side in ("orchard", "peer"):
        (gap,) = row[side]["values"]
        assert math.isfinite(gap) and gap >= 0
        assert math.isfinite(row["quality"][side]["worst PNG count vs true flowers %"])
    assert isinstance(row["target"]["met"], bool) and "5%" in row["target"]["text"]


def test_the_sides_differ_only_in_the_degradations():
    """The same seed and steps: without degradations the training is the same twice over, and
    the shipped degradations change what the model learns."""
    import torch

    from bench import flower_jpeg

    def weights(augment):
        return [p.detach().clone() for p in flower_jpeg.briefly_trained(augment, steps=3, seed=0).parameters()]

    plain, again = weights(None), weights(None)
    assert all(torch.equal(a, b) for a, b in zip(plain, again))
    shipped = weights(flower_jpeg.shipped_degradations())
    assert not all(torch.equal(a, b) for a, b in zip(plain, shipped))
