"""workloads/forest/histogram_kernels.py: the numba kernels (histograms, the bin cache, best splits, traversal)
against plain-numpy references."""
import math

import numpy as np
import pytest

from workloads.forest.features import candidate_pool, feature_matrix
from workloads.forest.histogram_kernels import (accumulate_bins, accumulate_histograms, assign_nodes, best_splits,
                                                encode_bins)

from .helpers import BG


def _random_scene(seed=0, n_img=3, h=24, w=32, n_ex=400):
    rng = np.random.default_rng(seed)
    depths = rng.integers(800, 4000, (n_img, h, w)).astype(np.uint16)
    depths[rng.random(depths.shape) < 0.2] = 0
    img = rng.integers(0, n_img, n_ex).astype(np.int32)
    ys, xs = rng.integers(0, h, n_ex).astype(np.int32), rng.integers(0, w, n_ex).astype(np.int32)
    depths[img, ys, xs] = np.maximum(depths[img, ys, xs], 500)  # examples always have a reading
    return rng, depths, img, ys, xs


def _numpy_response(depths, img, y, x, o):
    def probe(yy, xx):
        if not (0 <= yy < depths.shape[1] and 0 <= xx < depths.shape[2]) or depths[img, yy, xx] == 0:
            return 10000.0
        return float(depths[img, yy, xx])
    s = 1000.0 / float(depths[img, y, x])
    return (probe(y + math.floor(o[0] * s + 0.5), x + math.floor(o[1] * s + 0.5))
            - probe(y + math.floor(o[2] * s + 0.5), x + math.floor(o[3] * s + 0.5)))


@pytest.mark.parametrize("n_thresholds,dtype", [(1, np.int32), (5, np.int32), (50, np.uint16), (63, np.uint8)])
def test_histogram_kernel_matches_numpy_reference(n_thresholds, dtype):
    """The bin search (thresholds padded to 64) at its edges and every count dtype give
    numpy's searchsorted bins."""
    rng, depths, img, ys, xs = _random_scene()
    offsets, thresholds = candidate_pool(rng, 9, n_thresholds, 20.0, 3000.0, 0.3)
    thresholds[:, -1] = thresholds[:, 0]                       # a repeated threshold
    thresholds.sort(axis=1)
    columns = rng.integers(0, 7, len(img)).astype(np.int32)    # compact (node, class) columns
    hist = np.zeros((7, 9, n_thresholds + 1), dtype)
    accumulate_histograms(hist, depths, img, ys, xs, columns, offsets, thresholds, BG)
    responses = feature_matrix(depths, img, ys, xs, offsets, BG)
    expected = np.zeros_like(hist)
    for e in range(len(img)):
        for f in range(9):
            r = _numpy_response(depths, img[e], ys[e], xs[e], offsets[f])
            assert responses[e, f] == pytest.approx(r)
            expected[columns[e], f, np.searchsorted(thresholds[f], r, side="right")] += 1
    np.testing.assert_array_equal(hist, expected)
    assert hist.sum() == len(img) * 9


@pytest.mark.parametrize("n_thresholds,dtype", [(1, np.int32), (50, np.uint16), (63, np.uint8)])
def test_bin_cache_counts_what_the_on_the_fly_kernel_counts(n_thresholds, dtype):
    """encode_bins gives numpy's searchsorted bin of every (example, feature), and counting a
    feature partition's cached bins for any subset of rows, in any order, gives the histogram
    the on-the-fly kernel computes for the same examples."""
    rng, depths, img, ys, xs = _random_scene(seed=3)
    offsets, thresholds = candidate_pool(rng, 11, n_thresholds, 20.0, 3000.0, 0.3)
    codes = encode_bins(depths, img, ys, xs, offsets, thresholds, BG)
    assert codes.dtype == np.uint8 and codes.shape == (len(img), 11)
    responses = feature_matrix(depths, img, ys, xs, offsets, BG)
    for f in range(11):
        np.testing.assert_array_equal(codes[:, f], np.searchsorted(thresholds[f], responses[:, f], side="right"))
    rows = rng.permutation(len(img))[:250]                       # the examples one batch counts
    columns = rng.integers(0, 5, len(rows)).astype(np.int32)
    f0, f1 = 3, 9                                                # one feature partition of the pool
    cached = np.zeros((5, f1 - f0, n_thresholds + 1), dtype)
    accumulate_bins(cached, codes, rows, columns, f0)
    on_the_fly = np.zeros_like(cached)
    accumulate_histograms(on_the_fly, depths, img[rows], ys[rows], xs[rows], columns, offsets[f0:f1],
                          thresholds[f0:f1], BG)
    np.testing.assert_array_equal(cached, on_the_fly)
    assert cached.sum() == len(rows) * (f1 - f0)


def _numpy_gain(hist_node, weights, f, t):
    total = hist_node[f].sum(axis=0) * weights
    left = hist_node[f, :t + 1].sum(axis=0) * weights
    right = total - left

    def h(v):
        p = v[v > 0] / v.sum()
        return -(p * np.log(p)).sum()
    return h(total) - (left.sum() * h(left) + right.sum() * h(right)) / total.sum()


def test_best_split_matches_numpy_information_gain():
    rng = np.random.default_rng(1)
    hist = rng.integers(0, 4, (2, 5, 7, 31)).astype(np.int32)
    hist[:, :, :, 10:] = 0                        # a few classes only
    hist[:, 1:, :, :] = np.stack([np.roll(hist[:, 0], k, axis=1) for k in range(1, 5)], axis=1)
    hist[1, :, :, 6:] = 0                          # node 1 sees only 6 classes
    weights = rng.uniform(0.5, 2.0, 31)
    # compact layout: node s keeps only its classes that occur (columns), here 0..9 and 0..5
    present = [np.arange(10), np.arange(6)]
    compact = np.concatenate([hist[s][:, :, present[s]].transpose(2, 0, 1) for s in range(2)])
    col_start = np.array([0, 10, 16], np.int32)
    col_class = np.concatenate(present).astype(np.int32)
    feature, threshold, gain, left, right = best_splits(compact, col_start, col_class, weights, 1, 31)
    for s in range(2):
        gains = {(f, t): _numpy_gain(hist[s].astype(float), weights, f, t)
                 for f in range(5) for t in range(6)}
        best = max(gains.values())
        assert gain[s] == pytest.approx(best, rel=1e-9)
        assert (feature[s], threshold[s]) == min(k for k, v in gains.items() if v >= best - 1e-12)
        np.testing.assert_array_equal(left[s] + right[s], hist[s, 0].sum(axis=0))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32])
def test_a_split_gains_more_than_rounding_and_equal_gains_go_to_the_lowest_feature(dtype):
    """Deep nodes hold a few examples of a few classes. A node of one class gains exactly
    nothing by any split (its sums rounded to +-1e-16, and such nodes were split on down the
    tree): it stays unsplit. Many features split a node the same way through other bins
    (mirrored: one's left child is another's right): their gains are equal, their sums may
    round apart, and the first feature and threshold wins."""
    rng = np.random.default_rng(7)
    n_bins, n_features, unsplit, chosen = 51, 5, 0, []
    for trial in range(60):
        k = 1 if trial % 6 == 0 else int(rng.integers(2, 6))
        base = np.zeros((k, n_bins), np.int64)
        for _ in range(int(rng.integers(12, 60))):  # a few examples, in a few bins
            base[rng.integers(k), rng.integers(n_bins - 1)] += 1
        mirrored = base[:, ::-1].copy()  # every feature holds the same examples: bins reordered
        feats = [rng.permutation(base.T).T, mirrored, base, np.roll(mirrored, 1, axis=1), rng.permutation(base.T).T]
        hist = np.stack(feats, axis=1).astype(dtype)  # (k columns, features, bins)
        col_class = rng.permutation(31)[:k].astype(np.int32)
        weights = rng.uniform(0.2, 3.0, 31)
        feature, threshold, gain, _, _ = best_splits(hist, np.array([0, k], np.int32), col_class, weights, 3, 31)
        node = np.zeros((n_features, n_bins, 31))
        node[:, :, col_class] = hist.transpose(1, 2, 0)
        gains = {(f, t): _numpy_gain(node, weights, f, t) for f in range(n_features) for t in range(n_bins - 1)
                 if 3 <= node[f, :t + 1].sum() <= node[f].sum() - 3}
        best = max(gains.values(), default=0.0)
        if best <= 1e-12:  # one class (or no valid split): no gain
            assert feature[0] == -1 and (k == 1 or not gains)
            unsplit += 1
            continue
        assert gain[0] == pytest.approx(best, rel=1e-9)
        assert (feature[0], threshold[0]) == min(key for key, v in gains.items() if v >= best - 1e-12)
        chosen.append(int(feature[0]))
    assert unsplit >= 10 and 1 in chosen and 2 not in chosen  # feature 2 ties its mirror, feature 1, always


def test_tree_traversal_matches_python():
    rng, depths, img, ys, xs = _random_scene(2)
    offsets, thresholds = candidate_pool(rng, 3, 1, 20.0, 500.0, 0.0)
    # root splits on feature 0; its left child on feature 1; three leaves
    node_off = np.stack([offsets[0], offsets[1], np.zeros(4), np.zeros(4), np.zeros(4)]).astype(np.float32)
    node_thr = np.array([thresholds[0, 0], thresholds[1, 0], 0, 0, 0], np.float32)
    left = np.array([1, 3, -1, -1, -1], np.int32)
    right = np.array([2, 4, -1, -1, -1], np.int32)
    nodes = assign_nodes(depths, img, ys, xs, node_off, node_thr, left, right, BG)
    for e in range(len(img)):
        n = 0
        while left[n] >= 0:
            n = left[n] if _numpy_response(depths, img[e], ys[e], xs[e], node_off[n]) < node_thr[n] else right[n]
        assert nodes[e] == n
    assert len(set(nodes.tolist())) == 3


