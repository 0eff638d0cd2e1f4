"""Eq. 1 against hand-computed values; the numba kernels against plain-numpy references."""
import math

import numpy as np
import pytest

from workloads.forest.features import candidate_pool, feature_matrix, feature_response
from workloads.forest.histogram_kernels import (accumulate_bins, accumulate_histograms, assign_nodes, best_splits,
                                                encode_bins)

BG = np.float32(10000)


def test_feature_formula_by_hand():
    depths = np.zeros((1, 5, 7), np.uint16)
    depths[0, 2, 3] = 2000          # the pixel x: 2 m away
    depths[0, 2, 5] = 2100          # x + u/d: u = (0, 4) pixel-metres -> 4 / 2 m = 2 px right
    depths[0, 0, 3] = 1500          # x + v/d: v = (-4, 0) -> 2 px up
    # f = d(x + u/d(x)) - d(x + v/d(x)) = 2100 - 1500
    assert feature_response(depths, 0, 2, 3, 0.0, 4.0, -4.0, 0.0, BG) == pytest.approx(600.0)
    # v = 0 compares the probe with the pixel itself
    assert feature_response(depths, 0, 2, 3, 0.0, 4.0, 0.0, 0.0, BG) == pytest.approx(100.0)
    # a probe off the image, or on a pixel with no reading, reads the large constant
    assert feature_response(depths, 0, 2, 3, 0.0, 20.0, 0.0, 0.0, BG) == pytest.approx(10000 - 2000)
    assert feature_response(depths, 0, 2, 3, 2.0, 0.0, 0.0, 0.0, BG) == pytest.approx(10000 - 2000)
    # depth invariance: twice as far, the same world offset lands half as many pixels away
    depths[0, 2, 3] = 4000
    depths[0, 2, 4] = 4300
    assert feature_response(depths, 0, 2, 3, 0.0, 4.0, 0.0, 0.0, BG) == pytest.approx(300.0)


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
    cls = rng.integers(0, 31, len(img)).astype(np.uint8)
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


def test_histograms_are_as_narrow_as_their_largest_column_and_batches_widen_with_them():
    """Deep nodes hold a few hundred examples: their counts fit uint8/uint16, so a batch's
    histogram takes a quarter/half of the int32 bytes and the same budget holds more nodes;
    best_splits reads any of them to the same split."""
    from workloads.forest.batch_plan import plan_batches
    from workloads.forest.shuffle import count_dtype

    assert [count_dtype(n).name for n in (0, 255, 256, 65535, 65536)] == \
        ["uint8", "uint8", "uint16", "uint16", "int32"]
    nodes, columns = list(range(40)), [5] * 40
    budget = 20 * 5 * 10 * 8 * 4            # 20 nodes' int32 histograms (10 features, 8 bins)
    wide = plan_batches(nodes, columns, 10, 10, 8, 4, budget)
    narrow = plan_batches(nodes, columns, 10, 10, 8, 4, budget, [1] * 40)
    mixed = plan_batches(nodes, columns, 10, 10, 8, 4, budget, [1] * 20 + [4] * 20)
    assert [len(b[0]) for b in wide] == [20, 20] and {b[2] for b in wide} == {4}
    assert [len(b[0]) for b in narrow] == [40] and narrow[0][2] == 1
    assert all(len(b[0]) * 5 * 10 * 8 * b[2] <= budget for b in mixed) and mixed[-1][2] == 4

    rng = np.random.default_rng(3)
    hist = rng.integers(0, 200, (6, 4, 9)).astype(np.int32)
    col_start, col_class = np.array([0, 2, 6], np.int32), np.array([0, 3, 0, 1, 2, 5], np.int32)
    weights = rng.uniform(0.5, 2.0, 31)
    as_int32 = best_splits(hist, col_start, col_class, weights, 3, 31)
    for dtype in (np.uint8, np.uint16):
        for a, b in zip(as_int32, best_splits(hist.astype(dtype), col_start, col_class, weights, 3, 31)):
            np.testing.assert_array_equal(a, b)


def test_a_round_has_a_task_for_every_worker_by_splitting_the_features_further():
    from workloads.forest.batch_plan import fill_workers

    degrees = {"data_units": 4, "features": 2, "nodes": 2}
    assert fill_workers(degrees, 2, 1000) is degrees and fill_workers(degrees, 8, 1000) is degrees
    assert fill_workers(degrees, 16, 1000) == {"data_units": 4, "features": 4, "nodes": 2}
    assert fill_workers({**degrees, "data_units": 2}, 16, 1000)["features"] == 8
    assert fill_workers({**degrees, "data_units": 3}, 16, 1000)["features"] == 6  # 18 tasks: none short
    assert fill_workers({**degrees, "data_units": 1}, 64, 16)["features"] == 16  # never below one offset a part


def test_histogram_subtraction_is_exact_where_the_parent_overflows_the_childrens_width():
    """The larger child's histogram is the parent's minus the smaller's, in the batch's narrow
    counts (uint8 here: the children's columns fit it) even where the parent's do not: the
    parent is cast and subtracted modulo 256, and the true result fits (subtraction.py)."""
    from workloads.forest.subtraction import apply_init, subtract_siblings

    rng = np.random.default_rng(0)
    small = rng.integers(0, 120, (2, 5, 7))     # the smaller child: classes 3 and 7
    large = rng.integers(100, 256, (3, 5, 7))   # the larger child: classes 3, 7 and 9
    parent = large.astype(np.uint16)            # the parent's columns of the larger child's classes
    parent[:2] += small.astype(np.uint16)
    assert parent.max() > 255
    hist = np.zeros((5, 5, 7), np.uint8)        # the batch: smaller child's columns 0-1, larger's 2-4
    apply_init(hist, [(2, parent)])             # with the reset: the parent's columns, mod 256
    hist[:2] += small.astype(np.uint8)          # phase 2 counted the smaller child only
    subtract_siblings(hist, [(2, 0), (3, 1)])   # classes 3 and 7 are in both; 9 only in the larger
    np.testing.assert_array_equal(hist[2:], large)
    np.testing.assert_array_equal(hist[:2], small)


@pytest.mark.parametrize("density,dtype,top", [(0.01, np.uint8, 3), (0.01, np.uint16, 300), (0.9, np.uint16, 70000),
                                               (0.0, np.uint8, 0)])
def test_a_partial_travels_sparse_or_dense_and_adds_where_its_features_belong(density, dtype, top):
    """shuffle.encode_partial picks the smaller encoding (sparse deep in the tree, dense near the
    root) with counts as narrow as its largest, and add_partial puts a feature partition's slice at
    its features of the receiver's histogram: the same sums as numpy's dense add."""
    from workloads.forest.shuffle import add_partial, encode_partial, encoded_bytes

    rng = np.random.default_rng(7)
    wide = np.int32 if top >= 2**16 else dtype
    part = (rng.integers(1, max(top, 1) + 1, (6, 5, 9)) * (rng.random((6, 5, 9)) < density)).astype(wide)
    if top:
        part.flat[0] = top
    encoded = encode_partial(part)
    sparse = "index" in encoded
    assert sparse == (density < 0.5)                    # an empty slice: no cells at all
    counts = encoded["count"] if sparse else encoded["dense"]
    assert counts.dtype == (np.uint8 if top < 256 else np.uint16 if top < 2**16 else np.int32)
    assert encoded_bytes(encoded) <= part.size * counts.dtype.itemsize
    receiver = rng.integers(0, 5, (7, 12, 9)).astype(np.int64)
    expected = receiver.copy()
    expected[:6, 4:9] += part
    add_partial(receiver, 4, encoded)
    np.testing.assert_array_equal(receiver, expected)
