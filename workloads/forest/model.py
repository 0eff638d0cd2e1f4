"""The model: a forest of decision trees grown breadth first (section 3), and how it labels
the pixels of whole depth images (Appendix A).

Nodes are numbered in creation order (breadth first). Node n is internal iff
left[n] >= 0; it sends an example left when eq. 1 with offsets[n] is < threshold[n].
`counts[n]` holds the unweighted class counts of the training examples that reach n;
leaf distributions re-weight them by the tree's class weights (phase 1's normalisation
constants) so rare parts are not swamped by the torso.
Batch inference (numba): every pixel is pushed down each of the T trees; the per-pixel class
distribution is the average of the leaf distributions, its argmax the predicted part.
How a run saves and resumes a forest is checkpoint.py.
"""
from __future__ import annotations

import time

import numba
import numpy as np

from .body_parts import BACKGROUND
from .features import feature_response
from .jit import njit


class Tree:
    """Growable arrays of one tree; `arrays()` gives the contiguous views kernels need."""

    def __init__(self, n_classes: int):
        self.n_classes = n_classes
        self.offsets: list = []
        self.threshold: list = []
        self.left: list = []
        self.right: list = []
        self.depth: list = []
        self.feature: list = []
        self.counts: list = []

    def __len__(self) -> int:
        return len(self.left)

    def add_node(self, depth: int, counts: np.ndarray) -> int:
        """Append an (unsplit) node with class counts (C,); returns its id."""
        self.offsets.append(np.zeros(4, np.float32))
        self.threshold.append(0.0)
        self.left.append(-1)
        self.right.append(-1)
        self.depth.append(depth)
        self.feature.append(-1)
        self.counts.append(np.asarray(counts, np.int64))
        return len(self.left) - 1

    def split(self, node: int, feature: int, offsets: np.ndarray, threshold: float,
              left_counts: np.ndarray, right_counts: np.ndarray) -> tuple[int, int]:
        """Turn `node` into an internal node; returns the ids of its (left, right) children."""
        self.offsets[node] = np.asarray(offsets, np.float32)
        self.threshold[node] = float(threshold)
        self.feature[node] = int(feature)
        left = self.add_node(self.depth[node] + 1, left_counts)
        right = self.add_node(self.depth[node] + 1, right_counts)
        self.left[node], self.right[node] = left, right
        return left, right

    def arrays(self) -> dict:
        """Contiguous numpy arrays of every field (what tasks and checkpoints carry)."""
        return {
            "offsets": np.array(self.offsets, np.float32).reshape(-1, 4),
            "threshold": np.array(self.threshold, np.float32),
            "left": np.array(self.left, np.int32),
            "right": np.array(self.right, np.int32),
            "depth": np.array(self.depth, np.int16),
            "feature": np.array(self.feature, np.int32),
            "counts": np.array(self.counts, np.int64).reshape(-1, self.n_classes),
        }

    @classmethod
    def from_arrays(cls, arrays: dict) -> "Tree":
        """Inverse of `arrays()`."""
        tree = cls(arrays["counts"].shape[1])
        tree.offsets = [row.copy() for row in arrays["offsets"]]
        tree.threshold = [float(v) for v in arrays["threshold"]]
        tree.left = [int(v) for v in arrays["left"]]
        tree.right = [int(v) for v in arrays["right"]]
        tree.depth = [int(v) for v in arrays["depth"]]
        tree.feature = [int(v) for v in arrays["feature"]]
        tree.counts = [row.copy() for row in arrays["counts"]]
        return tree


def leaf_distributions(arrays: dict, class_weights: np.ndarray) -> np.ndarray:
    """Per-node class distribution P(c | node), (N, C) float32, from weighted counts."""
    weighted = arrays["counts"] * class_weights[None, :]
    total = weighted.sum(axis=1, keepdims=True)
    return (weighted / np.where(total > 0, total, 1.0)).astype(np.float32)


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


@njit(cache=True, parallel=True)
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
