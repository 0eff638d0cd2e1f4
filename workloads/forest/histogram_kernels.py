"""numba kernels of a training round: re-association, histograms (phase 2), best split (phase 3),
and the per-tree bin cache (encode_bins, accumulate_bins).

Histograms are compact (section 3: "sparse, and lazily allocated"): a node gets one
*column* per class that phase 1 saw among its examples, not all 31, so deep nodes that
hold a handful of parts cost a handful of columns. Layout: hist[column, feature, bin]
(counts as narrow as the batch allows: shuffle.count_dtype), with `col_start` (S+1,)
delimiting each node slot's columns and `col_class` (columns,) naming their class. `bin` = number of the feature's sorted
thresholds that are <= the response, so "response < threshold_k" (goes left) is exactly
bins 0..k and the paper's (node, feature, class, {left, right}) histogram is a
cumulative sum over bins: one increment per example-feature instead of one per threshold.
Threads own disjoint feature ranges, so no two threads write the same cell (GROUND.md:
`+=` into a shared histogram from prange is a data race).
"""
from __future__ import annotations

import math

import numba
import numpy as np

from .features import feature_response, inverse_depth_m, scaled_response
from .jit import njit


@njit(cache=True, parallel=True)
def assign_nodes(depths, ex_img, ex_y, ex_x, node_offsets, node_threshold, node_left,
                 node_right, background_mm):
    """Re-associate examples with their frontier node by traversing the partial tree from the root.

    Node n is internal iff node_left[n] >= 0; it sends an example left when eq. 1 with
    node_offsets[n] (4,) is < node_threshold[n]. Returns (E,) int32 node ids reached
    (a leaf or an unsplit frontier node).
    """
    out = np.empty(ex_img.shape[0], np.int32)
    for e in numba.prange(ex_img.shape[0]):
        n = 0
        while node_left[n] >= 0:
            o = node_offsets[n]
            r = feature_response(depths, ex_img[e], ex_y[e], ex_x[e], o[0], o[1], o[2], o[3],
                                 background_mm)
            n = node_left[n] if r < node_threshold[n] else node_right[n]
        out[e] = n
    return out


SEARCH_WIDTH = 64  # bins the branch-free search covers: at most 63 thresholds per feature (2.3: 50)


def accumulate_histograms(hist, depths, ex_img, ex_y, ex_x, ex_col, offsets, thresholds,
                          background_mm):
    """Add one data unit's examples into hist (columns, F, T+1) (any integer dtype), in place.

    ex_* (E,) describe the examples of the current node batch; ex_col is the histogram
    column of the example's (node, class). offsets (F, 4) and thresholds (F, T), T < 64
    (validate checks `forest.n_thresholds`), are this task's feature partition.
    """
    # A few feature blocks per thread balance the load; computed here because
    # get_num_threads() inside the kernel would stop numba from caching it.
    n_blocks = max(1, min(offsets.shape[0], 4 * numba.get_num_threads()))
    _accumulate(hist, depths, ex_img, ex_y, ex_x, ex_col, offsets, _padded(thresholds),
                np.float32(background_mm), n_blocks)


def _padded(thresholds):
    """Threshold rows padded with +inf to 64, so that a fixed six-step binary search finds the
    bin: ~1.6x the kernel's speed over counting 50 thresholds one by one in a toy, 1.2-1.3x in place."""
    if thresholds.shape[1] >= SEARCH_WIDTH:
        raise ValueError(f"at most {SEARCH_WIDTH - 1} thresholds per feature, got {thresholds.shape[1]}")
    padded = np.full((thresholds.shape[0], SEARCH_WIDTH), np.inf, np.float32)
    padded[:, :thresholds.shape[1]] = thresholds
    return padded


@njit(cache=True, inline="always")
def _bin_of(padded, f, r):
    """Number of feature f's sorted thresholds <= r: a binary search over its row padded to 64
    with +inf, written out as six conditional adds so that it compiles to conditional moves
    (a loop, or a branch around it, compiles to mispredicting jumps and loses the gain)."""
    b = 32 if padded[f, 31] <= r else 0
    b += 16 if padded[f, b + 15] <= r else 0
    b += 8 if padded[f, b + 7] <= r else 0
    b += 4 if padded[f, b + 3] <= r else 0
    b += 2 if padded[f, b + 1] <= r else 0
    b += 1 if padded[f, b] <= r else 0
    return b


@njit(cache=True, parallel=True)
def _accumulate(hist, depths, ex_img, ex_y, ex_x, ex_col, offsets, padded, background_mm, n_blocks):
    n_features = offsets.shape[0]
    for blk in numba.prange(n_blocks):
        f0 = blk * n_features // n_blocks
        f1 = (blk + 1) * n_features // n_blocks
        for e in range(ex_img.shape[0]):
            img, y, x, col = ex_img[e], ex_y[e], ex_x[e], ex_col[e]
            scale = inverse_depth_m(depths, img, y, x, background_mm)
            for f in range(f0, f1):
                r = scaled_response(depths, img, y, x, scale, offsets[f, 0], offsets[f, 1],
                                    offsets[f, 2], offsets[f, 3], background_mm)
                hist[col, f, _bin_of(padded, f, r)] += 1


def encode_bins(depths, ex_img, ex_y, ex_x, offsets, thresholds, background_mm):
    """Every example's bin under every candidate feature, (E, F) uint8: the bin cache.

    The bin is what phase 2 counts (`_bin_of`), and it depends only on the example and the
    tree's candidate pool, never on the node; computed once per tree, it lets every round count
    bins instead of evaluating eq. 1 again (accumulate_bins). One example per iteration, all
    features: its image stays in cache (the on-the-fly kernel sweeps every example per feature
    block), so encoding runs ~4x faster than the same evaluations in `accumulate_histograms`."""
    codes = np.empty((ex_img.shape[0], offsets.shape[0]), np.uint8)
    _encode(codes, depths, ex_img, ex_y, ex_x, offsets, _padded(thresholds), np.float32(background_mm))
    return codes


@njit(cache=True, parallel=True)
def _encode(codes, depths, ex_img, ex_y, ex_x, offsets, padded, background_mm):
    for e in numba.prange(ex_img.shape[0]):
        img, y, x = ex_img[e], ex_y[e], ex_x[e]
        scale = inverse_depth_m(depths, img, y, x, background_mm)
        for f in range(offsets.shape[0]):
            r = scaled_response(depths, img, y, x, scale, offsets[f, 0], offsets[f, 1],
                                offsets[f, 2], offsets[f, 3], background_mm)
            codes[e, f] = _bin_of(padded, f, r)


def accumulate_bins(hist, codes, rows, ex_col, f0):
    """Add cached bins into hist (columns, F', T+1), in place: example i (row rows[i] of
    `codes`, column ex_col[i]) under features f0..f0+F' of the pool. The same counts as
    accumulate_histograms on the same examples, a read and an increment per example-feature.

    One feature range per thread: every feature costs the same here (a read and an increment),
    so more ranges balance nothing and each re-reads every example's row: four ranges on one
    thread (the tasks' usual count) took ~1.35x one range's time, 8 on 2 threads ~1.3x 2."""
    n_blocks = max(1, min(hist.shape[1], numba.get_num_threads()))
    _accumulate_bins(hist, codes, rows, ex_col, f0, n_blocks)


@njit(cache=True, parallel=True)
def _accumulate_bins(hist, codes, rows, ex_col, f0, n_blocks):
    n_features = hist.shape[1]
    for blk in numba.prange(n_blocks):  # threads own feature ranges: no shared cell
        a = blk * n_features // n_blocks
        b = (blk + 1) * n_features // n_blocks
        for i in range(rows.shape[0]):
            row, col = codes[rows[i]], ex_col[i]
            for f in range(a, b):
                hist[col, f, row[f0 + f]] += 1


def best_splits(hist, col_start, col_class, class_weights, min_child_examples, n_classes):
    """Phase 3: best (feature, threshold) per node slot by weighted information gain.

    hist (columns, F, T+1) integer counts (uint8, uint16 or int32); slot s owns columns
    col_start[s]:col_start[s+1] of classes col_class[...]; class_weights (n_classes,) float64
    (inverse priors: phase 1's normalisation constants). Entropy is Shannon (nats). A split is
    valid when both children get >= min_child_examples examples and it gains more than
    TIE_NATS: a node of one class (entropy 0) gains exactly nothing by any split, and its sums
    rounded to +-1e-16, which split such nodes all the way down the tree. Ties go to the lowest
    (feature, threshold) index: a later candidate wins only by more than TIE_NATS, so splits of
    equal gain whose sums rounded apart in the last bits do not pick by rounding; the result
    does not depend on partitioning. Returns feature (S,) int32 (-1: no valid split),
    threshold index (S,) int32, gain (S,) float64, left counts (S, n_classes) int64, right
    counts (S, n_classes) int64.
    """
    class_weights = np.asarray(class_weights, np.float64)
    # the weighted entropy of counts n_j with weights w_j needs sum_j x_j log x_j, x_j = w_j n_j,
    # = sum_j w_j (n_j log n_j) + n_j (w_j log w_j): a table of n log n over the integers and
    # one w log w per class replace a log per class at every candidate (phase 3's cost deep down)
    top = int(hist[:, 0, :].sum(axis=1, dtype=np.int64).max()) if hist.shape[0] and hist.shape[1] else 0
    n = np.arange(top + 1, dtype=np.float64)
    n_log_n = n * np.log(np.maximum(n, 1.0))
    w_log_w = np.where(class_weights > 0, class_weights * np.log(np.where(class_weights > 0, class_weights, 1.0)), 0.0)
    return _best_splits(hist, col_start, col_class, class_weights, w_log_w, n_log_n,
                        int(min_child_examples), int(n_classes))


# gains closer than this are a tie, and a gain no larger is none (the search's sums are exact to
# ~1e-15 nats; two real candidates' gains over integer counts differ by far more)
TIE_NATS = 1e-12


@njit(cache=True, parallel=True)
def _best_splits(hist, col_start, col_class, class_weights, class_w_log_w, n_log_n,
                 min_child_examples, n_classes):
    """Per node and feature, a sweep over the thresholds that moves each bin's examples from
    the right child to the left. A node's weighted entropy needs W = sum_j w_j n_j and
    A = sum_j (w_j n_j log n_j + n_j w_j log w_j) per child (best_splits); a bin changes only the
    terms of the classes it holds, so each child's W and A are updated by those, not summed
    again over every class. The bins' sizes are read first, a column at a time in memory order;
    only bins that hold examples are read per class (deep down about a quarter: there the
    per-class sums at every threshold were ~2/3 of the search). The split minimising
    J = W_l log W_l - A_l + W_r log W_r - A_r maximises the gain, H(parent) - J / W."""
    n_slots = col_start.shape[0] - 1
    n_features, n_bins = hist.shape[1], hist.shape[2]
    best_f = np.full(n_slots, -1, np.int32)
    best_t = np.full(n_slots, -1, np.int32)
    best_gain = np.full(n_slots, -np.inf)
    left_out = np.zeros((n_slots, n_classes), np.int64)
    right_out = np.zeros((n_slots, n_classes), np.int64)
    for s in numba.prange(n_slots):
        c0, c1 = col_start[s], col_start[s + 1]
        k = c1 - c0
        if k < 2:
            continue  # one class: no split gains anything
        weights = np.empty(k, np.float64)
        w_log_w = np.empty(k, np.float64)
        total = np.zeros(k, np.int64)
        for j in range(k):
            weights[j] = class_weights[col_class[c0 + j]]
            w_log_w[j] = class_w_log_w[col_class[c0 + j]]
            for b in range(n_bins):
                total[j] += hist[c0 + j, 0, b]
        n_total = total.sum()
        w_all, a_all, weighted_all = 0.0, 0.0, 0  # weighted_all: examples of a class of weight > 0
        for j in range(k):
            c = total[j]
            if c > 0 and weights[j] > 0.0:
                w_all += weights[j] * c
                a_all += weights[j] * n_log_n[c] + c * w_log_w[j]
                weighted_all += c
        if w_all <= 0.0 or n_total < 2 * min_child_examples:
            continue
        h_parent = math.log(w_all) - a_all / w_all
        # J is W x nats: a split must gain more than TIE_NATS, W (H(parent) - TIE_NATS) > J
        best_j, tie = w_all * h_parent, TIE_NATS * w_all
        left = np.zeros(k, np.int64)  # each weighted class's examples left of the threshold
        in_bin = np.zeros(n_bins, np.int64)
        for f in range(n_features):
            in_bin[:] = 0
            for j in range(k):
                for t in range(n_bins - 1):
                    in_bin[t] += hist[c0 + j, f, t]
            left[:] = 0
            n_left, weighted_left = 0, 0
            w_l, a_l, w_r, a_r = 0.0, 0.0, w_all, a_all
            for t in range(n_bins - 1):
                if in_bin[t] == 0:
                    continue  # an empty bin: the same split as the threshold before (no better gain)
                for j in range(k):
                    c = hist[c0 + j, f, t]
                    if c == 0 or weights[j] <= 0.0:
                        continue  # no term changes (a class of weight 0 counts in n_left only)
                    l0, r0 = left[j], total[j] - left[j]
                    left[j] = l0 + c
                    w_l += weights[j] * c
                    w_r -= weights[j] * c
                    a_l += weights[j] * (n_log_n[l0 + c] - n_log_n[l0]) + c * w_log_w[j]
                    a_r += weights[j] * (n_log_n[r0 - c] - n_log_n[r0]) - c * w_log_w[j]
                    weighted_left += c
                n_left += in_bin[t]
                if n_total - n_left < min_child_examples:
                    break  # every later threshold leaves the right child smaller still
                if n_left < min_child_examples or weighted_left == 0 or weighted_left == weighted_all:
                    continue  # a child too small, or of no weight (its entropy is undefined)
                split = w_l * math.log(w_l) - a_l + w_r * math.log(w_r) - a_r
                if split < best_j - tie:
                    best_j, best_f[s], best_t[s] = split, f, t
        if best_f[s] >= 0:
            best_gain[s] = h_parent - best_j / w_all
            for j in range(k):
                c = col_class[c0 + j]
                for b in range(best_t[s] + 1):
                    left_out[s, c] += hist[c0 + j, best_f[s], b]
                right_out[s, c] = total[j] - left_out[s, c]
    return best_f, best_t, best_gain, left_out, right_out
