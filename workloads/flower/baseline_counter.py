"""The older flower counter (thesis 3.3.3), the baseline the CNN must beat.

Its counting phase: (a) convert to CIELab, (b) sigmoid mapping, (c) Determinant-of-Hessian
blob detection; the count is the number of blobs. The thesis does not give the sigmoid's
cutoff/gain nor the DoH threshold, so `calibrate` picks them by grid search on training tiles
(the fairest stand-in for the hand tuning the original had). Its image clustering phase
(histogram shifts, % yellow pixels) only chose which images to count, so it is not needed to
count a given tile.
"""
from __future__ import annotations

import itertools
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


def calibrate(tiles: np.ndarray, counts: np.ndarray, cutoffs: list[float], thresholds: list[float],
              gain: float, min_sigma: float, max_sigma: float) -> tuple[dict, float]:
    """Grid-search cutoff x threshold for the lowest MAE on (tiles, counts). Returns (params, mae)."""
    best: tuple[dict, float] | None = None
    for cutoff, threshold in itertools.product(cutoffs, thresholds):
        params = dict(cutoff=cutoff, gain=gain, threshold=threshold, min_sigma=min_sigma, max_sigma=max_sigma)
        predicted, _ = predict_counts(tiles, params)
        mae = float(np.mean(np.abs(predicted - counts)))
        if best is None or mae < best[1]:
            best = (params, mae)
    assert best is not None, "calibrate needs at least one cutoff and one threshold"
    return best
