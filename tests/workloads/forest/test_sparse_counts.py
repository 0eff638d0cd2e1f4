"""sparse_counts.py: phase 2's partials counted straight into their sparse form are, slice for
slice, what the dense path (accumulate_bins, then encode_partial) makes: the same arrays, dtypes
and choice of encoding, for several blocks, actors, column sizes and count dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.forest.histogram_kernels import accumulate_bins
from workloads.forest.shuffle import encode_partial
from workloads.forest.sparse_counts import sparse_partials, worth_it


def dense_path(codes, rows, columns, f0, n_features, n_bins, n_columns, bounds, dtype):
    hist = np.zeros((n_columns, n_features, n_bins), dtype)
    for c, r, col in zip(codes, rows, columns):
        accumulate_bins(hist, c, r, col, f0)
    return [encode_partial(hist[bounds[k]:bounds[k + 1]]) for k in range(len(bounds) - 1)]


def blocks(rng, n_blocks, examples, n_columns, cached, n_bins, crowded=None):
    """Bin caches of n_blocks blocks and, for each, some of its rows with their columns (sorted by
    column, as phase2_task hands them over); `crowded`: one column that gets most examples."""
    codes, rows, columns = [], [], []
    for _ in range(n_blocks):
        c = rng.integers(0, n_bins, (examples, cached), dtype=np.uint8)
        r = rng.choice(examples, size=examples // 2, replace=False)
        col = rng.integers(0, n_columns, len(r))
        if crowded is not None:
            col[: len(col) * 3 // 4] = crowded
        order = np.argsort(col, kind="stable")
        codes.append(c), rows.append(r[order]), columns.append(col[order].astype(np.int64))
    return codes, rows, columns


@pytest.mark.parametrize("n_blocks, examples, n_columns, n_features, bounds, dtype, crowded", [
    (1, 40, 30, 5, [0, 30], np.uint8, None),                 # deep: a few examples a column
    (3, 60, 50, 7, [0, 20, 21, 50], np.uint16, None),         # three actors, one of a single column
    (2, 400, 6, 4, [0, 3, 6], np.uint16, 2),                  # a crowded column: dense slices
    (2, 300, 40, 3, [0, 10, 40], np.int32, 7),                # mixed: one slice dense, one sparse
])
def test_sparse_slices_equal_the_dense_paths(n_blocks, examples, n_columns, n_features, bounds, dtype, crowded):
    rng = np.random.default_rng(n_blocks * 7 + examples)
    n_bins, cached, f0 = 11, 9, 2
    codes, rows, columns = blocks(rng, n_blocks, examples, n_columns, cached, n_bins, crowded)
    want = dense_path(codes, rows, columns, f0, n_features, n_bins, n_columns, bounds, dtype)
    got, held = sparse_partials(codes, rows, columns, f0, n_features, n_bins, bounds)
    assert held > 0 and len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in w:
            assert g[key].dtype == w[key].dtype and np.array_equal(g[key], w[key]), key


def test_a_task_with_no_examples_sends_each_actor_an_empty_slice():
    got, _ = sparse_partials([np.zeros((4, 3), np.uint8)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)],
                             0, 3, 5, [0, 4, 8])
    assert [len(g["index"]) for g in got] == [0, 0] and [tuple(g["shape"]) for g in got] == [(4, 3, 5)] * 2


def test_worth_it_where_the_counting_holds_less_than_the_histogram_would():
    # deep: 20,000 examples over 4,000 columns of 51 bins; near the root: 20,000 over 60 columns
    assert worth_it(20_000, 4_000, 125, 51) and not worth_it(20_000, 60, 125, 51)
    rng = np.random.default_rng(0)
    for _ in range(50):   # where it says so, what the task holds stays under the dense histogram's bytes
        examples, n_columns, n_features = (int(v) for v in rng.integers(1, 60, 3))
        if worth_it(examples, n_columns, n_features, 11):
            codes = rng.integers(0, 11, (examples, n_features), dtype=np.uint8)
            columns = np.sort(rng.integers(0, n_columns, examples))
            _, held = sparse_partials([codes], [np.arange(examples)], [columns], 0, n_features, 11, [0, n_columns])
            assert held <= n_columns * n_features * 11


def test_a_deep_tasks_slices_from_its_bin_caches_are_those_eq1_counts_on_the_fly():
    """round_tasks.count_slices as phase2_task calls it: two blocks, many columns of few examples
    each (deep in the tree, where it counts sparse), against the same examples evaluated on the
    fly (no bin caches: the dense path)."""
    from .helpers import BG
    from .test_histogram_kernels import _random_scene
    from workloads.forest.features import candidate_pool
    from workloads.forest.histogram_kernels import encode_bins
    from workloads.forest.round_tasks import count_slices

    rng, depths, img, ys, xs = _random_scene(seed=5)
    offsets, thresholds = candidate_pool(rng, 12, 20, 20.0, 3000.0, 0.3)
    f0, f1, n_columns, bounds = 4, 10, 120, [0, 50, 120]
    by_block, on_the_fly = [], []
    for part in np.array_split(rng.permutation(len(img)), 2):   # two blocks of the partition
        block = {"depths": depths, "ex_img": img[part], "ex_y": ys[part], "ex_x": xs[part]}
        codes = encode_bins(depths, img[part], ys[part], xs[part], offsets, thresholds, BG)
        rows = rng.permutation(len(part))[: len(part) // 2]
        columns = rng.integers(0, n_columns, len(rows))
        order = np.argsort(columns, kind="stable")
        rows, columns = rows[order], columns[order].astype(np.int32)
        by_block.append((block, codes, rows, rows, columns))
        on_the_fly.append((block, None, rows, rows, columns))
    assert worth_it(sum(len(b[2]) for b in by_block), n_columns, f1 - f0, thresholds.shape[1] + 1)
    got, held, sparse = count_slices(by_block, f0, offsets[f0:f1], thresholds[f0:f1], BG, n_columns, bounds,
                                     np.uint16)
    want, dense, on_the_fly_sparse = count_slices(on_the_fly, f0, offsets[f0:f1], thresholds[f0:f1], BG, n_columns,
                                                  bounds, np.uint16)
    assert sparse and not on_the_fly_sparse and held < dense   # no histogram held
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and all(np.array_equal(g[k], w[k]) for k in w)
