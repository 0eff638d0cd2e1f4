"""The shuffle of a round (2.2, 2.3): partial histograms on the wire, and a model of its bytes.

A phase-2 task sums every data unit of its partition into one histogram *where it is made*
(one partial per task, not per data unit), then ships each histogram actor its slice in
whichever of two encodings is smaller:
    dense   the (columns, features, bins) counts in the narrowest unsigned dtype that holds them
    sparse  the flat indices (uint32) of the non-zero cells and their counts (narrowest dtype)
Deep in the tree a node holds a few examples of a few classes, so ~1% of a slice's cells are
non-zero (issue 20) and sparse wins by ~10-50x; near the root dense wins. Counts are exact
integers either way, so the tree does not depend on the encoding.

`model_round_bytes` predicts the bytes a round ships from the shape of the problem; docs/forest.md
tabulates it at the paper's scale and tests check it against the measured `round/shuffle_bytes`.
"""
from __future__ import annotations

import numpy as np

from .jit import njit

INDEX_BYTES = 4  # uint32 flat index of a non-zero cell


def count_dtype(max_count: int) -> np.dtype:
    """The narrowest dtype for counts up to `max_count`: of an encoded partial's cells, and of a
    batch's histograms (train.py: a column's examples are known from phase 1, so deep in the tree,
    where a node has a few hundred examples, its histogram is uint8 or uint16, not int32 -- a half
    to a quarter of the memory, the bytes zeroed and summed, and the cache the kernel's scattered
    increments miss)."""
    return np.dtype(np.uint8 if max_count < 2**8 else np.uint16 if max_count < 2**16 else np.int32)


def encode_partial(hist: np.ndarray) -> dict:
    """One actor's slice (columns, F_part, bins) of a task's histogram -> the smaller encoding.

    Returns {"shape": (3,) int64, "dense": array} or {"shape", "index": uint32, "count": uint*}.
    Two numba passes over the slice (count and largest count, then gather), not numpy's
    flatnonzero: deep in the tree a slice is hundreds of MB, and an int64 index of every non-zero
    cell, a cast and two gathers cost more than counting the cells did.
    """
    shape = np.asarray(hist.shape, np.int64)
    flat = np.ascontiguousarray(hist).reshape(-1)
    nonzero, top = _census(flat)
    dtype = count_dtype(int(top))
    if sparse_is_smaller(nonzero, flat.size, dtype):
        index, count = np.empty(nonzero + 1, np.uint32), np.empty(nonzero + 1, dtype)
        _gather(flat, index, count)
        return {"shape": shape, "index": index[:nonzero], "count": count[:nonzero]}
    return {"shape": shape, "dense": flat.astype(dtype, copy=False).reshape(hist.shape)}


def sparse_is_smaller(nonzero: int, cells: int, dtype: np.dtype) -> bool:
    """Whether a partial of ``cells`` cells, ``nonzero`` of them non-zero, with counts of
    ``dtype``, is smaller sparse than dense (and its flat indices fit uint32)."""
    return nonzero * (INDEX_BYTES + dtype.itemsize) < cells * dtype.itemsize and cells < 2**32


@njit(cache=True)
def _census(flat):
    """(non-zero cells, largest count) of a flat histogram, in one branch-free pass (deep slices
    are ~10% non-zero at random places: a branch per cell mispredicts)."""
    nonzero, top = 0, flat.dtype.type(0)
    for i in range(flat.shape[0]):
        v = flat[i]
        nonzero += v != 0
        top = max(top, v)
    return nonzero, top


@njit(cache=True)
def _gather(flat, index, count):
    """The flat indices and counts of the non-zero cells, in order; every cell is written at the
    next free slot and the slot advances only past a non-zero one (branch-free: `index` and
    `count` have a spare last slot)."""
    k = 0
    for i in range(flat.shape[0]):
        v = flat[i]
        index[k] = i
        count[k] = v
        k += v != 0


def dense_partial(hist: np.ndarray) -> dict:
    """A histogram in the partial form as it is, dense (no pass over it: for what does not cross
    a network, where a copy through shared memory costs less than encoding it)."""
    return {"shape": np.asarray(hist.shape, np.int64), "dense": hist}


def encoded_bytes(partial: dict) -> int:
    """Bytes of an encoded partial's arrays (what crosses the network, framing aside)."""
    return int(sum(v.nbytes for k, v in partial.items() if k != "shape"))


def place_partial(hist: np.ndarray, row_start: int, partial: dict) -> None:
    """hist[row_start:row_start + rows] = a dense partial (``dense_partial``: parents never travel
    encoded, histogram_actor.take), cast modulo 2^bits to hist's dtype; those rows of hist must be
    zero (a reset's fresh columns)."""
    rows = int(partial["shape"][0])
    np.copyto(hist[row_start:row_start + rows], partial["dense"], casting="unsafe")


def add_partial(hist: np.ndarray, feature_start: int, partial: dict) -> None:
    """hist[:, feature_start:feature_start + F_part] += the decoded partial, in place."""
    cols, f_part, bins = (int(v) for v in partial["shape"])
    if "dense" in partial:
        hist[:cols, feature_start:feature_start + f_part] += partial["dense"]
        return
    _add_sparse(hist, partial["index"], partial["count"], f_part, bins, feature_start)


@njit(cache=True)
def _add_sparse(hist, index, count, f_part, bins, feature_start):
    """hist[c, feature_start + f, b] += count for the flat (c, f, b) indices of a sparse partial
    (a loop: numpy's unravel_index and fancy-index add take ~10x longer deep in the tree; one
    division per cell: the partial's (f, b) offset within a column is the same in `hist`)."""
    row = f_part * bins
    out = hist.reshape(-1)  # hist is C-contiguous (the actor's or the driver's own histogram)
    full_row = hist.shape[1] * bins
    base = feature_start * bins
    for i in range(index.shape[0]):
        flat = np.int64(index[i])
        c = flat // row
        out[c * full_row + base + flat - c * row] += count[i]


def model_round_bytes(examples: float, nodes: float, classes_per_node: float, n_features: int,
                      n_bins: int, data_partitions: int, feature_partitions: int) -> dict:
    """Predicted shuffle of one round (bytes), from the shape of the problem.

    A task covers examples / data_partitions examples and n_features / feature_partitions
    features; its histogram has nodes x classes_per_node columns x its features x n_bins
    cells. Each example-feature increments one cell, so a task's non-zero cells are at most
    min(cells, its example-features). It ships the smaller of dense (1 byte a cell, 2 once
    a task holds >= 256 examples) and sparse (4 + 1 bytes a non-zero cell, 4 + 2 where
    cells average >= 64). Phase 1 returns 31 int64 counts per frontier node and data
    partition. Returns bytes {"histograms", "counts", "total", "dense"}; "dense" is what
    int32 partials for every cell took before issue 20 (counts for the frontier only).
    """
    tasks = data_partitions * feature_partitions
    task_examples = examples / data_partitions
    f_part = n_features / feature_partitions
    cells = nodes * classes_per_node * f_part * n_bins
    nonzero = min(cells, task_examples * f_part)
    dense_cell = 1 if task_examples < 256 else 2
    sparse_cell = INDEX_BYTES + (2 if task_examples * f_part / max(nonzero, 1) >= 64 else 1)
    per_task = min(cells * dense_cell, nonzero * sparse_cell)
    counts = data_partitions * nodes * 31 * 8
    hist = tasks * per_task
    return {"histograms": hist, "counts": counts, "total": hist + counts,
            "dense": tasks * cells * 4 + counts}
