"""The older flower counter (thesis 3.3.3), the baseline the CNN must beat.

Its counting phase: (a) convert to CIELab, (b) sigmoid mapping, (c) Determinant-of-Hessian
blob detection; the count is the number of blobs. The thesis does not give the sigmoid's
cutoff/gain nor the DoH threshold, so `calibrate_and_count` picks them by grid search on
training tiles (the fairest stand-in for the hand tuning the original had), as Ray tasks, and
`cached_calibration` keeps the result beside the tiles, keyed by their content and the grid. Its image clustering phase
(histogram shifts, % yellow pixels) only chose which images to count, so it is not needed to
count a given tile.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import time

import numpy as np
from skimage.color import rgb2lab
from skimage.exposure import adjust_sigmoid
from skimage.feature import blob_doh


def yellowness(rgb: np.ndarray, cutoff: float, gain: float) -> np.ndarray:
    """Sigmoid-mapped CIELab b* (yellow-blue axis) in [0, 1]: (H, W) from RGB uint8 (H, W, 3).

    b* in [-128, 127] is rescaled to [0, 1] first; cutoff is in those rescaled units.
    """
    b_star = rgb2lab(rgb)[..., 2]
    unit = np.clip((b_star + 128.0) / 255.0, 0.0, 1.0)
    return adjust_sigmoid(unit, cutoff=cutoff, gain=gain)


def count_blobs(rgb: np.ndarray, cutoff: float, gain: float, threshold: float,
                min_sigma: float, max_sigma: float) -> np.ndarray:
    """DoH blobs (K, 3) rows (y, x, sigma) of the yellow map of one RGB tile."""
    mapped = yellowness(rgb, cutoff, gain)
    return blob_doh(mapped, min_sigma=min_sigma, max_sigma=max_sigma, num_sigma=6, threshold=threshold)


def predict_counts(tiles: np.ndarray, params: dict) -> tuple[np.ndarray, float]:
    """Counts (N,) for tiles (N, H, W, 3) uint8, and the elapsed seconds."""
    start = time.perf_counter()
    counts = np.array([len(count_blobs(t, **params)) for t in tiles], dtype=np.float64)
    return counts, time.perf_counter() - start


# --------------------------------------------------------------------------- paid once, in parallel
CACHE_VERSION = "blob-doh-1"  # bump when counting changes: old cached counts no longer apply


def _count_with(tiles: np.ndarray, settings: list[dict]) -> tuple[list[np.ndarray], float]:
    """Counts of every tile under each settings dict (the body of one Ray task), and its seconds."""
    start = time.perf_counter()
    return [np.array([len(count_blobs(t, **p)) for t in tiles], np.float64) for p in settings], \
        time.perf_counter() - start


def _count_rows(tiles: np.ndarray, rows: np.ndarray, setting: dict) -> tuple[list[np.ndarray], float]:
    return _count_with(tiles[rows], [setting])


def _spread(tiles: np.ndarray, settings: list[dict], parts: int) -> tuple[list[np.ndarray], float]:
    """``_count_with`` as 1-CPU Ray tasks: one per setting and chunk of tiles (the tiles travel
    once, through the object store). Returns the counts per setting and the tasks' summed
    seconds (one core's time for the whole job, whatever the parallelism)."""
    import ray

    run = ray.remote(num_cpus=1)(_count_rows)
    ref = ray.put(np.ascontiguousarray(tiles))
    chunks = [c for c in np.array_split(np.arange(len(tiles)), max(1, parts)) if len(c)]
    jobs = {(s, c): run.remote(ref, chunks[c], settings[s]) for s in range(len(settings)) for c in range(len(chunks))}
    results = dict(zip(jobs, ray.get(list(jobs.values()))))
    counts = [np.concatenate([results[(s, c)][0][0] for c in range(len(chunks))]) if chunks else np.zeros(0)
              for s in range(len(settings))]
    return counts, float(sum(r[1] for r in results.values()))


def calibrate_and_count(calib_tiles: np.ndarray, calib_counts: np.ndarray, test_tiles: np.ndarray,
                        grid: dict, cpus: int) -> dict:
    """Grid-search cutoff x threshold for the lowest count MAE on the calibration tiles (the
    first best in grid order), then count the test tiles with it; Ray tasks over ``cpus`` CPUs.
    Returns {params, calibration_mae, test_counts, test_s (one core's seconds for the test tiles)}."""
    settings = [{"cutoff": c, "gain": grid["gain"], "threshold": t, "min_sigma": grid["min_sigma"],
                 "max_sigma": grid["max_sigma"]}
                for c, t in itertools.product(grid["cutoffs"], grid["thresholds"])]
    assert settings, "calibration needs at least one cutoff and one threshold"
    # enough tasks to fill the CPUs even when the grid is smaller than the cluster
    counts, _ = _spread(calib_tiles, settings, -(-cpus // len(settings)))
    maes = [float(np.mean(np.abs(c - calib_counts))) for c in counts]
    best = int(np.argmin(maes))
    test_counts, test_s = _spread(test_tiles, [settings[best]], cpus)
    return {"params": settings[best], "calibration_mae": maes[best], "test_counts": test_counts[0].tolist(),
            "test_s": test_s}


def content_key(calib_tiles: np.ndarray, calib_counts: np.ndarray, test_tiles: np.ndarray, grid: dict) -> str:
    """What the calibrated counter and its test counts depend on: the pixels and counts it is
    fitted on, the pixels it counts, the grid, the counting code's version."""
    digest = hashlib.sha1(CACHE_VERSION.encode())
    digest.update(json.dumps({k: grid[k] for k in sorted(grid)}, sort_keys=True).encode())
    for array in (calib_tiles, np.asarray(calib_counts, np.int64), test_tiles):
        array = np.ascontiguousarray(array)
        digest.update(str(array.shape).encode())
        digest.update(array.data)
    return digest.hexdigest()[:16]


def cached_calibration(store, calib_tiles: np.ndarray, calib_counts: np.ndarray, test_tiles: np.ndarray,
                       grid: dict, cpus: int) -> tuple[dict, bool]:
    """``calibrate_and_count``, kept in ``store`` (an orchard Storage beside the tiles) under
    its content key; a run on the same data and grid reads it back. Returns (result, hit)."""
    name = f"{content_key(calib_tiles, calib_counts, test_tiles, grid)}.json"
    if store.exists(name):
        return store.read_json(name), True
    result = calibrate_and_count(calib_tiles, calib_counts, test_tiles, grid, cpus)
    store.write_json(name, result)  # published whole: a concurrent run sees all of it or none
    return result, False
