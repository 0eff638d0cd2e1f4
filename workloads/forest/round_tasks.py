"""The Ray task bodies of a round (2.2): what phase 1 and phase 2 run on the workers.

  phase1_task  one per data partition: re-associate each example with its frontier node by
               traversing the partial tree from the root; class counts per frontier node.
  phase2_task  one per (data partition x feature partition) of a node batch: the partial
               (node-class column, feature, threshold bin) histograms by the numba kernel,
               cut into one encoded slice per receiving histogram actor (shuffle.py).
The driver side (train.py's RoundRunner) wraps them in ``ray.remote`` and sends their slices on.
"""
from __future__ import annotations

import time

import numpy as np

from .body_parts import NUM_PARTS
from .data_unit import tree_selection


def _set_threads(threads: int) -> None:
    import numba
    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


def _reassociate(block, traversal, selection, background_mm):
    """Selected example indices of a block and the node each one reaches, (K,), (K,)."""
    from .histogram_kernels import assign_nodes

    ex = np.nonzero(tree_selection(block, **selection))[0]
    nodes = assign_nodes(block["depths"], block["ex_img"][ex], block["ex_y"][ex],
                         block["ex_x"][ex], traversal["offsets"], traversal["threshold"],
                         traversal["left"], traversal["right"], background_mm)
    return ex, nodes


def traversal_arrays(tree_arrays: dict) -> dict:
    """What tasks need of the tree to re-associate examples: the split fields only (the
    class counts of every node, (N, 31) int64, stay on the driver)."""
    return {k: tree_arrays[k] for k in ("offsets", "threshold", "left", "right")}


def _slots(sorted_nodes: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Position of each of `nodes` in `sorted_nodes`, -1 where absent."""
    pos = np.searchsorted(sorted_nodes, nodes)
    pos = np.minimum(pos, len(sorted_nodes) - 1)
    return np.where(sorted_nodes[pos] == nodes, pos, -1)


def phase1_task(traversal, frontier, selection, background_mm, threads, *blocks):
    """Class counts (K, C) int64 of the examples reaching each of the K frontier nodes
    (`frontier` sorted): only the frontier, never the whole tree (issue 20's 100 GB)."""
    start = time.perf_counter()
    _set_threads(threads)
    counts = np.zeros(len(frontier) * NUM_PARTS, np.int64)
    for block in blocks:
        ex, nodes = _reassociate(block, traversal, selection, background_mm)
        slot = _slots(frontier, nodes)
        keep = slot >= 0
        counts += np.bincount(slot[keep].astype(np.int64) * NUM_PARTS + block["ex_cls"][ex][keep],
                              minlength=len(frontier) * NUM_PARTS)
    return counts.reshape(len(frontier), NUM_PARTS), time.perf_counter() - start


def phase2_task(traversal, batch_nodes, column_of, col_lo, col_hi, offsets, thresholds,
                column_bounds, hist_dtype, selection, background_mm, threads, fault, *blocks):
    """Partial histograms of one (data partition, feature partition) for one node batch.

    batch_nodes (B,) sorted node ids; column_of (B, C) int32: histogram column of (node,
    class), -1 where the class is absent. Only columns [col_lo, col_hi) are counted (all of
    the batch normally; one actor's share when its lost partials are recomputed).
    column_bounds: boundaries of each receiving actor's columns, relative to col_lo.
    hist_dtype: the batch's count dtype (shuffle.count_dtype: it holds the largest column's total).
    Returns one encoded slice (shuffle.encode_partial) per receiving actor, then a stats
    dict (busy seconds, example-features, histogram bytes, bytes shipped encoded / dense).
    `fault` (tests only): a marker path; the first task to see it absent creates it and
    kills its own worker process mid-task.
    """
    from .histogram_kernels import accumulate_histograms
    from .shuffle import encode_partial, encoded_bytes

    start = time.perf_counter()
    _set_threads(threads)
    hist = np.zeros((col_hi - col_lo, len(offsets), thresholds.shape[1] + 1), hist_dtype)
    example_features = 0
    for i, block in enumerate(blocks):
        ex, nodes = _reassociate(block, traversal, selection, background_mm)
        slot = _slots(batch_nodes, nodes)
        columns = np.where(slot >= 0, column_of[np.maximum(slot, 0), block["ex_cls"][ex]], -1)
        mine = (columns >= col_lo) & (columns < col_hi)
        # grouping examples by column keeps one node's histogram rows hot in cache
        order = np.argsort(columns[mine], kind="stable")
        ex, columns = ex[mine][order], columns[mine][order] - col_lo
        accumulate_histograms(hist, block["depths"], block["ex_img"][ex], block["ex_y"][ex],
                              block["ex_x"][ex], columns, offsets, thresholds, background_mm)
        example_features += len(ex) * len(offsets)
        if fault and i == 0:
            _die_once(fault)
    parts = [encode_partial(hist[column_bounds[k]:column_bounds[k + 1]])
             for k in range(len(column_bounds) - 1)]
    stats = {"busy_s": time.perf_counter() - start, "example_features": example_features,
             "hist_bytes": hist.nbytes, "shuffle_bytes": sum(encoded_bytes(p) for p in parts),
             "dense_bytes": hist.size * 4}  # int32 partials, as before issue 20
    return (*parts, stats)


def _die_once(marker: str) -> None:
    """Test hook: SIGKILL this worker process the first time `marker` does not exist."""
    import os
    import signal
    from pathlib import Path

    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
