"""Depth-comparison features (Appendix A, eq. 1) and the per-tree candidate pool.

    f_theta(I; x) = d_I(x + u / d_I(x)) - d_I(x + v / d_I(x)),   theta = (u, v)

Offsets u, v are stored in pixel-metres, so the probe lands u / d_I(x)[m] pixels away
(rounded to the nearest pixel): a fixed world-space offset whatever the distance.
A probe outside the image or on a pixel with no reading (depth 0, i.e. background)
reads `background_mm`, a large constant, as in Shotton et al.

Where the paper is terse we chose: the pool of offset pairs and thresholds
(2.3: "2000 offsets x 50 thresholds = 100,000 features") is drawn once per tree and
shared by all its nodes; this fixed feature space is what Figure 1 partitions across
tasks, and it lets the peers in bench/ train on exactly the same candidates.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from .jit import njit


@njit(cache=True, inline="always")
def probe_depth(depths, img, y, x, background_mm):
    """Depth (mm) at integer pixel (y, x) of image `img`, or `background_mm` off-image / no reading."""
    if y < 0 or x < 0 or y >= depths.shape[1] or x >= depths.shape[2]:
        return background_mm
    d = depths[img, y, x]
    if d == 0:
        return background_mm
    return np.float32(d)


@njit(cache=True, inline="always")
def feature_response(depths, img, y, x, uy, ux, vy, vx, background_mm):
    """Eq. 1 at pixel (y, x) of depths[img] (uint16 mm) for offsets (uy, ux), (vy, vx) in pixel-metres."""
    return scaled_response(depths, img, y, x, inverse_depth_m(depths, img, y, x, background_mm),
                           uy, ux, vy, vx, background_mm)


@njit(cache=True, inline="always")
def inverse_depth_m(depths, img, y, x, background_mm):
    """1 / d_I(x) with d in metres: the offset scale of eq. 1 (hoisted out of feature loops)."""
    return 1000.0 / probe_depth(depths, img, y, x, background_mm)


@njit(cache=True, inline="always")
def scaled_response(depths, img, y, x, scale, uy, ux, vy, vx, background_mm):
    """Eq. 1 given scale = inverse_depth_m(...) of the pixel (y, x)."""
    a = probe_depth(depths, img, y + int(math.floor(uy * scale + 0.5)),
                    x + int(math.floor(ux * scale + 0.5)), background_mm)
    b = probe_depth(depths, img, y + int(math.floor(vy * scale + 0.5)),
                    x + int(math.floor(vx * scale + 0.5)), background_mm)
    return a - b


@njit(cache=True, parallel=True)
def feature_matrix(depths, ex_img, ex_y, ex_x, offsets, background_mm):
    """All candidate responses: (E, F) float32 for E examples and offsets (F, 4).

    Only the benchmark's peers need this (they cannot compute features on the fly);
    orchard's trainer never materialises it (2.1).
    """
    n, f_count = ex_img.shape[0], offsets.shape[0]
    out = np.empty((n, f_count), np.float32)
    for e in numba.prange(n):
        for f in range(f_count):
            out[e, f] = feature_response(depths, ex_img[e], ex_y[e], ex_x[e], offsets[f, 0],
                                         offsets[f, 1], offsets[f, 2], offsets[f, 3], background_mm)
    return out


def candidate_pool(rng: np.random.Generator, n_offsets: int, n_thresholds: int,
                   max_offset_pxm: float, threshold_range_mm: float, unary_fraction: float):
    """Draw a tree's candidate features.

    Returns offsets (n_offsets, 4) float32 = (u_y, u_x, v_y, v_x) in pixel-metres, uniform
    in [-max_offset_pxm, max_offset_pxm], with v = 0 for a `unary_fraction` of them
    (a probe compared with the pixel's own depth), and thresholds (n_offsets,
    n_thresholds) float32 in mm, uniform in +-threshold_range_mm, sorted per row.
    """
    offsets = rng.uniform(-max_offset_pxm, max_offset_pxm, (n_offsets, 4)).astype(np.float32)
    offsets[rng.random(n_offsets) < unary_fraction, 2:] = 0.0
    thresholds = rng.uniform(-threshold_range_mm, threshold_range_mm, (n_offsets, n_thresholds))
    return offsets, np.sort(thresholds, axis=1).astype(np.float32)
