"""workloads/flower/baseline_counter.py: the blob counter, the thesis's baseline, calibrated once per
content in Ray tasks."""
from __future__ import annotations

import numpy as np
import pytest


def test_the_blob_counter_is_calibrated_once_per_content_in_ray_tasks(ray_session, tmp_path):
    from orchard.storage import Storage
    from workloads.flower import baseline_counter
    from workloads.flower.synthetic_field import render_field

    rng = np.random.default_rng(0)
    tiles, counts = [], []
    for _ in range(6):
        rgb, points, _ = render_field(rng, 32, 32, (0, 0, 32, 32), 32, 2.0, (2.5, 4.0), 0.0, 0.0)
        tiles.append(rgb)
        counts.append(len(points))
    tiles, counts = np.stack(tiles), np.array(counts)
    grid = {"cutoffs": [0.7, 0.8], "thresholds": [0.01, 0.02], "gain": 20.0, "min_sigma": 1.5, "max_sigma": 4.0}
    store = Storage(tmp_path / "tiles-32" / "baseline")
    first, hit = baseline_counter.cached_calibration(store, tiles[:4], counts[:4], tiles[4:], grid, cpus=2)
    assert not hit
    # the grid search as one process would do it: the same choice, the same test counts
    serial = []
    for cutoff in grid["cutoffs"]:
        for threshold in grid["thresholds"]:
            params = {"cutoff": cutoff, "gain": 20.0, "threshold": threshold, "min_sigma": 1.5, "max_sigma": 4.0}
            serial.append((float(np.mean(np.abs(baseline_counter.predict_counts(tiles[:4], params)[0] - counts[:4]))),
                           params))
    best = min(serial, key=lambda m: m[0])  # min keeps the first of equals, like the grid order
    assert first["params"] == best[1] and first["calibration_mae"] == pytest.approx(best[0])
    assert first["test_counts"] == baseline_counter.predict_counts(tiles[4:], best[1])[0].tolist()
    again, hit = baseline_counter.cached_calibration(store, tiles[:4], counts[:4], tiles[4:], grid, cpus=2)
    assert hit and again == first
    # other tiles or another grid: calibrated anew
    assert not baseline_counter.cached_calibration(store, tiles[1:5], counts[1:5], tiles[4:], grid, cpus=2)[1]
    assert not baseline_counter.cached_calibration(store, tiles[:4], counts[:4], tiles[4:], {**grid, "gain": 10.0},
                                                   cpus=1)[1]
