"""The Ray task bodies of a round (2.2): what phase 1 and phase 2 run on the workers.

  phase1_task  one per data partition: re-associate each example with its frontier node by
               traversing the partial tree from the root; class counts per frontier node.
  encode_task  once per tree, one per data partition: each block's bin cache, the bin of every
               selected example under every candidate feature (histogram_kernels.encode_bins),
               block by block while they fit the partition's share of `forest.bin_cache_mb`.
  phase2_task  one per (data partition x feature partition) of a node batch: the partial
               (node-class column, feature, threshold bin) histograms by the numba kernel
               (counting cached bins, or eq. 1 on the fly for a block without them),
               cut into one encoded slice per receiving histogram actor (shuffle.py) and sent
               to it by the task itself; deep in the tree counted straight into those slices,
               without a histogram (sparse_counts.py).
The driver side (train.py's RoundRunner) wraps them in ``ray.remote``.
"""
from __future__ import annotations

import os
import time

import numpy as np

from .body_parts import NUM_PARTS
from .data_unit import tree_selection


def _node() -> str | None:
    """The id of the node this task runs on (None outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def keep_a_current_folder() -> None:
    """Move to the temp folder when this process's current folder is gone.

    numba's compiler calls ``os.getcwd()``. On a two-node cluster_utils.Cluster the nodes share one
    session folder, and a lost node's end removed the job's working_dir copy that the other node's
    workers run in: a histogram actor re-created there, and then a phase-2 task compiling a kernel
    after the loss (every retry in the same worker), failed with FileNotFoundError. Nothing here
    reads a path relative to it."""
    import os
    import tempfile

    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(tempfile.gettempdir())


def numba_threads(threads: int) -> None:
    """The parallel kernels' thread count from here on, within what numba's pool holds."""
    import numba

    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


def _ready_for_numba(threads: int) -> None:
    """At a task's start: a current folder for numba's compiler, and the task's thread count."""
    keep_a_current_folder()
    numba_threads(threads)


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
    (`frontier` sorted): only the frontier, never the whole tree (issue 20's 100 GB); then busy
    seconds and the id of the node it ran on."""
    start = time.perf_counter()
    _ready_for_numba(threads)
    counts = np.zeros(len(frontier) * NUM_PARTS, np.int64)
    for block in blocks:
        ex, nodes = _reassociate(block, traversal, selection, background_mm)
        slot = _slots(frontier, nodes)
        keep = slot >= 0
        counts += np.bincount(slot[keep].astype(np.int64) * NUM_PARTS + block["ex_cls"][ex][keep],
                              minlength=len(frontier) * NUM_PARTS)
    return counts.reshape(len(frontier), NUM_PARTS), time.perf_counter() - start, _node()


def encode_task(offsets, thresholds, selection, background_mm, threads, budget_bytes, fault, *blocks):
    """The bin cache of each of `blocks` for one tree: (selected examples, F) uint8 codes in the
    order of the block's selected examples. Blocks are cached in order while they fit
    `budget_bytes` (this partition's share of `forest.bin_cache_mb`); a block past it gets None
    and its examples are evaluated on the fly every round. Returns one value per block, then
    stats: busy seconds, which blocks were cached, the cache's bytes. `fault`: as phase2_task's."""
    from .histogram_kernels import encode_bins

    start = time.perf_counter()
    _ready_for_numba(threads)
    out, used = [], 0
    for block in blocks:
        ex = np.nonzero(tree_selection(block, **selection))[0]
        if used + len(ex) * len(offsets) > budget_bytes:
            out.append(None)
            continue
        used += len(ex) * len(offsets)
        out.append(encode_bins(block["depths"], block["ex_img"][ex], block["ex_y"][ex], block["ex_x"][ex],
                               offsets, thresholds, background_mm))
        if fault:
            die_once(fault)
    return (*out, {"busy_s": time.perf_counter() - start, "cached": [c is not None for c in out], "bytes": used,
                   "node": _node()})


def phase2_task(traversal, batch_nodes, column_of, col_lo, col_hi, offsets, thresholds, f0,
                column_bounds, hist_dtype, selection, background_mm, threads, fault, receivers, part_id, *units):
    """Partial histograms of one (data partition, feature partition) for one node batch.

    batch_nodes (B,) sorted node ids; column_of (B, C) int32: histogram column of (node,
    class), -1 where the class is absent. Only columns [col_lo, col_hi) are counted (all of
    the batch normally; one actor's share when its lost partials are recomputed).
    column_bounds: boundaries of each receiving actor's columns, relative to col_lo.
    hist_dtype: the batch's count dtype (shuffle.count_dtype: it holds the largest column's total).
    offsets, thresholds: the pool's features f0.. of this partition. units: the partition's
    blocks, then as many bin caches (encode_task; None: evaluate eq. 1 on the fly).
    receivers: None, or (the receiving actors, their batch's resets): the task sends each actor
    its slice itself as task `part_id`'s (`send_slices`) and returns a stats dict (busy seconds,
    example-features, histogram bytes, bytes shipped encoded / dense) with the adds' refs
    ("acks"). With None (the driver is the one reducer) it returns its one encoded
    slice (shuffle.encode_partial's form), then the stats. The slices are counted in a dense
    histogram, or, where the examples are few against its cells and every block has its bin
    cache, straight into their sparse form (sparse_counts.py).
    `fault` (tests only): a marker path; the first task to see it absent creates it and
    kills its own worker process mid-task.
    """
    from .shuffle import encoded_bytes

    start = time.perf_counter()
    _ready_for_numba(threads)
    n_columns, n_bins = col_hi - col_lo, thresholds.shape[1] + 1
    blocks, caches = units[:len(units) // 2], units[len(units) // 2:]
    mine_by_block = []  # (block, its bin cache, examples, their cache rows, their columns from col_lo)
    for i, (block, codes) in enumerate(zip(blocks, caches)):
        ex, nodes = _reassociate(block, traversal, selection, background_mm)
        slot = _slots(batch_nodes, nodes)
        columns = np.where(slot >= 0, column_of[np.maximum(slot, 0), block["ex_cls"][ex]], -1)
        mine = np.nonzero((columns >= col_lo) & (columns < col_hi))[0]
        # grouping examples by column keeps one node's histogram rows hot in cache
        rows = mine[np.argsort(columns[mine], kind="stable")]  # positions among the selected = cache rows
        mine_by_block.append((block, codes, ex[rows], rows, columns[rows] - col_lo))
        if fault and i == 0:
            die_once(fault)
    examples = sum(len(m[2]) for m in mine_by_block)
    parts, held, sparse = count_slices(mine_by_block, f0, offsets, thresholds, background_mm, n_columns,
                                       column_bounds, hist_dtype)
    stats = {"busy_s": time.perf_counter() - start, "example_features": examples * len(offsets),
             "hist_bytes": held, "sparse": sparse, "shuffle_bytes": sum(encoded_bytes(p) for p in parts),
             "dense_bytes": n_columns * len(offsets) * n_bins * 4,  # int32 partials, as before issue 20
             "node": _node(),  # where it ran: the driver checks it against its units' home
             "pid": os.getpid()}  # and in which process: the driver counts the processes the rounds used
    if receivers is None:
        return (*parts, stats)
    return {**stats, "acks": send_slices(*receivers, part_id, f0, parts)}


def send_slices(actors: list, resets: list, part_id: int, f0: int, parts: list) -> list:
    """Phase 2's shuffle, from the task that counted the slices: slice k to ``actors[k]``, to be
    summed after that actor's reset for the batch (``resets[k]``, a ref the driver sent it; None
    once it is done), as task `part_id`'s. Returns the adds' refs, the acknowledgements the
    driver reads once the batch's tasks are done (HistogramPool.acked).

    The tasks, not the driver, make these calls: a batch of T tasks and A actors is T x A of them,
    which on the driver alone took it longer the more workers there were (docs/forest.md, "A
    round"). The task does not wait for them: an actor sums one slice at a time, and a worker
    held until its slices were summed would idle beside the next task's work. The refs belong
    to the task's worker process, which Ray does not end while it owns them; one lost before the
    driver read them (with its node) reads as slices not summed, and those actors' shares are
    counted again."""
    return [actor.add.remote(part_id, f0, part, reset) for actor, part, reset in zip(actors, parts, resets)]


def count_slices(by_block: list, f0: int, offsets, thresholds, background_mm, n_columns: int, column_bounds,
                 hist_dtype, sparse: bool | None = None) -> tuple[list, int, bool]:
    """Phase 2's counting: the encoded slices, one per actor, of the histogram (n_columns,
    features, bins) of ``by_block``'s examples [(block, its bin cache or None, examples, their
    cache rows, their columns)], the bytes held to make them, and whether it counted sparse. Counted in a dense histogram,
    or, where every block has its bin cache and the examples are few against the cells
    (``sparse`` None: sparse_counts.worth_it decides), straight into their sparse form: the same
    slices, a fraction of the memory passes."""
    from .histogram_kernels import accumulate_bins, accumulate_histograms
    from .shuffle import encode_partial
    from .sparse_counts import sparse_partials, worth_it

    n_bins = thresholds.shape[1] + 1
    if sparse is None:
        sparse = all(m[1] is not None for m in by_block) and \
            worth_it(sum(len(m[2]) for m in by_block), n_columns, len(offsets), n_bins)
    if sparse:
        return (*sparse_partials([m[1] for m in by_block], [m[3] for m in by_block], [m[4] for m in by_block],
                                 f0, len(offsets), n_bins, column_bounds), True)
    hist = np.zeros((n_columns, len(offsets), n_bins), hist_dtype)
    for block, codes, ex, rows, columns in by_block:
        if codes is not None:
            accumulate_bins(hist, codes, rows, columns, f0)
        else:
            accumulate_histograms(hist, block["depths"], block["ex_img"][ex], block["ex_y"][ex],
                                  block["ex_x"][ex], columns, offsets, thresholds, background_mm)
    parts = [encode_partial(hist[column_bounds[k]:column_bounds[k + 1]]) for k in range(len(column_bounds) - 1)]
    return parts, hist.nbytes, False


def die_once(marker: str) -> None:
    """Test hook: SIGKILL this worker process the first time `marker` does not exist."""
    import os
    import signal
    from pathlib import Path

    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
