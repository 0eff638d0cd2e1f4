"""Phase 2 deep in the tree: a task's partials counted straight into their sparse form.

A phase-2 task's histogram has a cell for every (node-class column, feature, threshold bin):
columns x features x bins. Near the root a column holds thousands of examples and most cells are
hit; deep in the tree a column holds a handful, and of a task's cells ~1-10% are non-zero
(shuffle.py). The dense path (histogram_kernels.accumulate_bins, then shuffle.encode_partial)
still zeroes every cell, then reads every cell twice to encode the few non-zero ones: three
passes over memory per task, each as large as the histogram (up to `forest.memory_budget_mb`),
against one increment per example and feature. On the 16-core machine sixteen such tasks at once
took three times the busy seconds four did (docs/scaling.md, 2026-12-04); memory passes that grow
with the histogram, not the work, are what more cores share worst.

Where the examples are few against the cells (`worth_it`: the counting below holds less than the
histogram would), a task counts from its bin caches
without a histogram: its examples' cached bins of its features, gathered into one compact
(examples, features) matrix sorted by column (a few MB), are counted one column at a time in a
small per-column table that stays in cache, and each non-zero cell is written out once, in flat
order: the same index and count arrays, cell for cell, that encode_partial makes of the dense
histogram, so the actors, the bytes on the wire and the trees do not change.
"""
from __future__ import annotations

import numpy as np

from .jit import njit
from .shuffle import INDEX_BYTES, count_dtype, sparse_is_smaller


# what the sparse counting holds: per example-feature its cached bin (1 byte) and room for one
# non-zero cell (a uint32 index and a uint32 count); per example its column and sort order
HELD_PER_EXAMPLE_FEATURE, HELD_PER_EXAMPLE = 1 + INDEX_BYTES + 4, 16


def worth_it(examples: int, n_columns: int, n_features: int, n_bins: int) -> bool:
    """Count sparse where that holds less memory than the dense histogram would at its narrowest
    (1 byte a cell): deep in the tree, where a column's examples are few against its cells. So a
    task never holds more than its dense histogram, which `forest.memory_budget_mb` bounds."""
    held = examples * (n_features * HELD_PER_EXAMPLE_FEATURE + HELD_PER_EXAMPLE)
    return held < n_columns * n_features * n_bins


def sparse_partials(codes: list, rows: list, columns: list, f0: int, n_features: int, n_bins: int,
                    column_bounds) -> tuple[list, int]:
    """Encoded slices (one per actor: columns [column_bounds[k], column_bounds[k + 1])) of the
    histogram (column_bounds[-1], n_features, n_bins) that counts, for every block i, its examples
    ``rows[i]`` (rows of its bin cache ``codes[i]``) in columns ``columns[i]`` under features
    f0 .. f0 + n_features of the pool. Returns (slices, the bytes the task held to make them)."""
    x = np.concatenate([c[r, f0:f0 + n_features] for c, r in zip(codes, rows)]) if codes \
        else np.zeros((0, n_features), np.uint8)
    col = np.concatenate(columns).astype(np.int64) if columns else np.zeros(0, np.int64)
    order = np.argsort(col, kind="stable")
    x, col = np.ascontiguousarray(x[order]), col[order]
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1], True]) if len(col) else np.zeros(1, np.int64)
    bounds = np.asarray(column_bounds, np.int64)
    # every example-feature hits at most one new cell: an exact upper bound on the non-zero cells;
    # indices are relative to their slice (uint32, as encode_partial's; a slice of 2^32 cells or
    # more is sent dense, below)
    widest = int(np.diff(bounds).max(initial=0)) * n_features * n_bins
    index = np.empty(len(col) * n_features, np.uint32 if widest < 2**32 else np.int64)
    count = np.empty(len(col) * n_features, np.uint32)
    cut = np.zeros(len(bounds), np.int64)
    _count_columns(x, col, starts.astype(np.int64), bounds, n_features, n_bins, index, count, cut)
    slices = [_encoded(index[cut[k]:cut[k + 1]], count[cut[k]:cut[k + 1]],
                       (int(bounds[k + 1] - bounds[k]), n_features, n_bins)) for k in range(len(bounds) - 1)]
    return slices, x.nbytes + col.nbytes + index.nbytes + count.nbytes


def _encoded(index: np.ndarray, count: np.ndarray, shape: tuple) -> dict:
    """A slice's non-zero cells in encode_partial's form: the smaller of sparse and dense, the
    counts in the narrowest dtype that holds them."""
    dtype = count_dtype(int(count.max()) if len(count) else 0)
    cells = int(np.prod(shape))
    if sparse_is_smaller(len(index), cells, dtype):
        return {"shape": np.asarray(shape, np.int64), "index": index.astype(np.uint32, copy=False),
                "count": count.astype(dtype)}
    dense = np.zeros(cells, dtype)
    dense[index] = count
    return {"shape": np.asarray(shape, np.int64), "dense": dense.reshape(shape)}


@njit(cache=True)
def _count_columns(x, col, starts, bounds, n_features, n_bins, index, count, cut):
    """The non-zero cells of the histogram of the examples ``x`` (E, F) (bins, sorted by their
    column ``col``; ``starts``: where each column's run begins, then E), as flat indices within
    their slice (columns bounds[s] .. bounds[s + 1]: ((column - bounds[s]) x F + feature) x bins
    + bin) and their counts, in increasing flat order; ``cut[s]``: where slice s begins in them,
    ``cut[-1]`` how many there are. A column's counts live in a (F, bins) table that is zeroed
    again as it is read: the only memory touched is the examples' and the output's."""
    table = np.zeros((n_features, n_bins), np.int32)
    touched = np.empty(n_bins, np.int64)
    k, s = 0, 0
    for r in range(starts.shape[0] - 1):
        a, b = starts[r], starts[r + 1]
        c = col[a]
        while c >= bounds[s + 1]:  # the slices before this column's are done
            s += 1
            cut[s] = k
        for i in range(a, b):
            for f in range(n_features):
                table[f, x[i, f]] += 1
        few = 2 * (b - a) < n_bins  # few examples: walk them for the bins they hit, not all bins
        for f in range(n_features):
            base = ((c - bounds[s]) * n_features + f) * n_bins
            if few:
                m = 0
                for i in range(a, b):
                    v = x[i, f]
                    if table[f, v] > 0:  # a bin met for the first time: noted, marked (negative)
                        touched[m] = v
                        m += 1
                        table[f, v] = -table[f, v]
                # ascending bins (insertion sort of at most b - a values), then written out
                for p in range(1, m):
                    key = touched[p]
                    q = p - 1
                    while q >= 0 and touched[q] > key:
                        touched[q + 1] = touched[q]
                        q -= 1
                    touched[q + 1] = key
                for p in range(m):
                    v = touched[p]
                    index[k] = base + v
                    count[k] = -table[f, v]
                    table[f, v] = 0
                    k += 1
            else:
                for v in range(n_bins):
                    if table[f, v] > 0:
                        index[k] = base + v
                        count[k] = table[f, v]
                        table[f, v] = 0
                        k += 1
    for t in range(s + 1, cut.shape[0]):  # the slices after the last column's: empty
        cut[t] = k
