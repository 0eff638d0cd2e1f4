"""Batch inference of the forest over whole images (numba) and its evaluation.

Every pixel is pushed down each of the T trees; the per-pixel class distribution is
the average of the leaf distributions (Appendix A), its argmax the predicted part.
As in the Kinect pipeline the classifier labels the person's pixels (the depth camera
segments players from the background first), so evaluation covers every pixel whose
ground truth is a body part and that has a depth reading.
"""
from __future__ import annotations

import time

import numba
import numpy as np

from .body_parts import BACKGROUND, NUM_PARTS
from .features import feature_response
from .tree import leaf_distributions


def pack_forest(trees: list[dict], class_weights: list[np.ndarray]) -> dict:
    """Concatenate T trees into flat arrays; roots (T,) index each tree's root node."""
    base, parts = 0, {"offsets": [], "threshold": [], "left": [], "right": [], "dist": []}
    roots = []
    for arrays, weights in zip(trees, class_weights):
        roots.append(base)
        parts["offsets"].append(arrays["offsets"])
        parts["threshold"].append(arrays["threshold"])
        parts["left"].append(np.where(arrays["left"] >= 0, arrays["left"] + base, -1))
        parts["right"].append(np.where(arrays["right"] >= 0, arrays["right"] + base, -1))
        parts["dist"].append(leaf_distributions(arrays, weights))
        base += len(arrays["left"])
    packed = {k: np.ascontiguousarray(np.concatenate(v)) for k, v in parts.items()}
    packed["left"] = packed["left"].astype(np.int32)
    packed["right"] = packed["right"].astype(np.int32)
    packed["roots"] = np.array(roots, np.int32)
    return packed


@numba.njit(cache=True, parallel=True)
def predict_pixels(depths, img, ys, xs, offsets, threshold, left, right, dist, roots,
                   background_mm):
    """Forest prediction for P pixels: returns (P,) uint8 part labels (argmax of the
    tree-averaged distribution). depths (n, H, W) uint16 mm; img, ys, xs (P,) int."""
    out = np.empty(img.shape[0], np.uint8)
    n_classes = dist.shape[1]
    for p in numba.prange(img.shape[0]):
        acc = np.zeros(n_classes, np.float32)
        for t in range(roots.shape[0]):
            n = roots[t]
            while left[n] >= 0:
                o = offsets[n]
                r = feature_response(depths, img[p], ys[p], xs[p], o[0], o[1], o[2], o[3],
                                     background_mm)
                n = left[n] if r < threshold[n] else right[n]
            for c in range(n_classes):
                acc[c] += dist[n, c]
        out[p] = np.argmax(acc)
    return out


def predict_images(packed: dict, depths: np.ndarray, mask: np.ndarray, background_mm: float):
    """Label the masked pixels of images depths (n, H, W): returns (n, H, W) uint8 labels
    (BACKGROUND outside the mask) and the throughput in pixels per second."""
    img, ys, xs = (a.astype(np.int32) for a in np.nonzero(mask))
    args = (packed["offsets"], packed["threshold"], packed["left"], packed["right"],
            packed["dist"], packed["roots"], np.float32(background_mm))
    predict_pixels(depths, img[:1], ys[:1], xs[:1], *args)  # compile before timing
    start = time.perf_counter()
    labels = predict_pixels(depths, img, ys, xs, *args)
    seconds = time.perf_counter() - start
    out = np.full(depths.shape, BACKGROUND, np.uint8)
    out[img, ys, xs] = labels
    return out, len(img) / max(seconds, 1e-9)


def confusion_matrix(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """(C, C) int64 counts, rows = true part, columns = predicted part, body pixels only."""
    body = truth < NUM_PARTS
    flat = truth[body].astype(np.int64) * NUM_PARTS + predicted[body]
    return np.bincount(flat, minlength=NUM_PARTS * NUM_PARTS).reshape(NUM_PARTS, NUM_PARTS)


def accuracy_metrics(confusion: np.ndarray) -> dict:
    """Per-pixel accuracy and mean per-class accuracy (over parts present in the truth)."""
    per_class_total = confusion.sum(axis=1)
    present = per_class_total > 0
    per_class = np.diag(confusion)[present] / per_class_total[present]
    return {"pixel_accuracy": float(np.trace(confusion) / max(confusion.sum(), 1)),
            "mean_class_accuracy": float(per_class.mean()) if present.any() else 0.0,
            "class_accuracy": {int(c): float(a) for c, a in zip(np.nonzero(present)[0], per_class)}}
