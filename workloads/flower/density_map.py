"""Ground-truth density maps from point annotations (thesis 3.3.5).

The thesis puts 255 at every flower centre and blurs with a Gaussian kernel normalised to sum
to one. Blurring near a tile border loses the part of a Gaussian that falls outside the tile,
so the map's sum would undercount border flowers. Here each flower's Gaussian is truncated to
the tile and renormalised, so a map always sums to exactly the annotated count (the count is
what the CNN learns to reproduce). The thesis's x255 factor is a training-time target scale
(`flower.density_scale`), not part of the ground truth.
"""
from __future__ import annotations

import numpy as np


def density_map(points: np.ndarray, height: int, width: int, sigma: float) -> np.ndarray:
    """Density map (height, width) float32 whose sum equals len(points).

    points: (N, 2) float array of (x, y) pixel coordinates (column, row) inside the tile;
    sigma: Gaussian standard deviation in pixels.
    """
    out = np.zeros((height, width), dtype=np.float32)
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    if len(points) == 0:
        return out
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    # A 2-D Gaussian is separable: per flower, a row profile times a column profile. Normalising
    # each 1-D profile over the tile makes each flower's truncated Gaussian sum to one.
    xs = np.arange(width, dtype=np.float64)
    ys = np.arange(height, dtype=np.float64)
    gx = np.exp(-0.5 * ((xs[None, :] - points[:, 0:1]) / sigma) ** 2)  # (N, W)
    gy = np.exp(-0.5 * ((ys[None, :] - points[:, 1:2]) / sigma) ** 2)  # (N, H)
    gx /= np.maximum(gx.sum(axis=1, keepdims=True), 1e-300)
    gy /= np.maximum(gy.sum(axis=1, keepdims=True), 1e-300)
    out[:] = gy.T @ gx  # sum over flowers of outer(gy_n, gx_n): (H, W)
    return out
