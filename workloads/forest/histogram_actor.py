"""Histogram actors: each owns a partition of the frontier nodes (2.2, phases 2-3).

Phase-2 tasks send an actor the slice of their partial histogram that covers its
nodes (sparse or dense, shuffle.py); the actor sums the slices of all data partitions into
one lazily allocated compact (node-class columns, features, bins) array and, in phase 3,
picks the best feature and threshold per node. Integer counts make the sum independent of
arrival order, so the result does not depend on how the work was partitioned or retried.

Fault tolerance: the actor reports which partials it has summed. A restarted actor has
no batch (`shape` is None): it ignores partials until the driver resets it, and its
phase-3 answer names no partials, so the driver sees the loss, resets it and has the lost
partials recomputed by deterministic phase-2 tasks (train.py). Partials are therefore
never kept in the object store past the add that consumes them.

Histogram subtraction (subtraction.py): a reset may carry `init`, the parents' columns that
derived nodes start from (sent again with every reset, so a restarted actor gets them too);
`best` subtracts each derived column's sibling first, and, asked to `keep`, holds the batch's
histogram until the driver `take`s the columns it keeps as the next round's parents: it keeps
them itself (`held`), starts its own derived nodes from them in the next round, and `give`s
another actor the ones it needs (the driver holds only where each is).
"""
from __future__ import annotations

import time

import numpy as np

from .round_tasks import die_once, keep_a_current_folder, numba_threads
from .shuffle import add_partial, dense_partial
from .subtraction import apply_init, ParentsLost, resolve_init, subtract_siblings


def _arriving(values, dtype) -> np.ndarray:
    """An array as an actor's call receives it: read-only, as Ray gives an argument from the
    object store (numba compiles a read-only array's kernel apart from a writable one's)."""
    out = np.asarray(values, dtype)
    out.flags.writeable = False
    return out


def start_numba() -> None:
    """Pay numba's start in this process (its compiler and code generator, ~0.4 s from the cache
    on 2 cores, 0.6-1.0 s beside busy tasks) with one kernel an actor calls, the sum of a sparse
    slice of uint8 counts into a uint16 batch, with the types Ray delivers (read-only slices);
    the other kernels it calls then load from numba's cache in milliseconds.

    An actor paid that start in the first slice it summed, and held up that batch's
    acknowledgements: at the mid shape the actors whose first batch came at depths 0, 2 and 8
    did so by 0.2-0.5 s each, on one node and on two, about 1 s of a 16-18 s tree
    (docs/scaling.md, "Where the two-node half second goes"). Here, at the actor's start, it
    overlaps the data step's last wave or the tree's encode (train.py, ``start_actors``). One
    kernel, not all it may call: where the cache is empty (a fresh install, a changed package)
    each would be compiled, the split search's three in ~15 s, by every actor starting at once."""
    add_partial(np.zeros((1, 1, 2), np.uint16), 0, {"shape": np.array([1, 1, 2], np.int64),
                                                     "index": _arriving([0], np.uint32), "count": _arriving([1], np.uint8)})


class HistogramActor:
    """Sums partial histograms for one node partition; computes their best splits."""

    def __init__(self):
        keep_a_current_folder()
        # Several actors share the machine with the phase-2 tasks: one thread each while they
        # sum; phase 3 (`best`) runs alone and may take more.
        numba_threads(1)
        start_numba()  # before any batch: off the rounds' path
        self.shape = None  # no batch yet (also after a restart): partials are ignored
        self.dtype = np.dtype(np.int32)
        self.hist = None
        self.parts: set = set()
        self.busy_s = 0.0
        self.peak_bytes = 0
        self.held: dict = {}  # parent key -> (round taken, dense partial): subtraction.py

    def reset(self, n_columns: int, n_features: int, n_bins: int, dtype: str = "int32", init=None,
              round_no: int | None = None) -> bool:
        """Start a node batch of round `round_no`; the histogram (counts of `dtype`, wide enough
        for the batch's largest column: shuffle.count_dtype) is allocated lazily on the first add,
        or now when `init` [(first column, parent)] starts derived nodes from their parents: its
        own (popped from `held`), another actor's (given), or the driver's (subtraction.py:
        resolve_init). Parents taken before the last round are dropped: no batch needs them. False
        when a parent could not be had (this actor restarted since it took it, or the giver's node
        is gone): the driver counts the batch in full."""
        self.shape, self.dtype = (n_columns, n_features, n_bins), np.dtype(dtype)
        self.hist, self.parts, self.busy_s, self.peak_bytes = None, set(), 0.0, 0
        if round_no is not None:
            self.held = {key: v for key, v in self.held.items() if v[0] >= round_no - 1}
        if init:
            try:
                init = resolve_init(init, self._pop_held)
            except ParentsLost:
                self.shape = None  # no batch: partials are ignored until the driver resets again
                return False
            self.hist = np.zeros(self.shape, self.dtype)
            self.peak_bytes = self.hist.nbytes
            apply_init(self.hist, init)
        return True

    def _pop_held(self, key):
        """A held parent's partial, no longer held; None when this actor does not hold it."""
        return self.held.pop(tuple(key), (None, None))[1]

    def add(self, part_id: int, feature_start: int, partial: dict, after=None) -> int:
        """Sum a task's encoded partial (shuffle.encode_partial) into features
        [feature_start, ...); `part_id` identifies the task. Returns parts summed so far,
        -1 when the actor has no batch (it was restarted: the driver will reset it). `after`:
        the batch's reset, as the ref the driver got for it: Ray runs this call once that reset
        has run (the task sending the slice is not the reset's caller, whose calls keep their order)."""
        if self.shape is None:
            return -1
        keep_a_current_folder()  # numba may compile here (a partial of a new type) after the folder went
        start = time.perf_counter()
        if part_id not in self.parts:  # a replayed partial must not be counted twice
            if self.hist is None:
                self.hist = np.zeros(self.shape, self.dtype)
                self.peak_bytes = self.hist.nbytes
            add_partial(self.hist, feature_start, partial)
            self.parts.add(part_id)
        self.busy_s += time.perf_counter() - start
        return len(self.parts)

    def best(self, col_start: np.ndarray, col_class: np.ndarray, class_weights: np.ndarray,
             min_child_examples: int, derive=None, keep: bool = False, fault=None, threads: int = 1) -> dict:
        """Phase 3 over this actor's nodes (their columns: col_start (S+1,), col_class);
        see `histogram_kernels.best_splits`. {"parts": None} when it has no batch.
        derive: (P, 2) (derived column, sibling column) pairs to subtract first; keep: hold the
        histogram for `take` (else it is freed here). fault (tests only): a marker path, as
        round_tasks.phase2_task's: the first actor to see it absent dies before it answers.
        threads: the split search's threads (over its nodes): phase 3 runs while no phase-2
        task does, so with fewer actors than the running workers' cores each searches on its
        share of them (train.py, ``_phase3_threads``); back to one for the next batch's sums."""
        from .histogram_kernels import best_splits

        keep_a_current_folder()  # the folder may go after the actor started
        if self.shape is None:
            return {"parts": None}
        start, cpu_start = time.perf_counter(), time.process_time()
        if self.hist is None:
            self.hist = np.zeros(self.shape, self.dtype)
        subtract_siblings(self.hist, derive)
        if fault:
            die_once(fault)
        weights = np.asarray(class_weights, np.float64)
        numba_threads(threads)
        try:
            feature, threshold, gain, left, right = best_splits(
                self.hist, col_start, col_class, weights, int(min_child_examples), len(weights))
        finally:
            numba_threads(1)
        # on several threads the search keeps several cores busy: the effective parallelism
        # counts its CPU seconds (all threads'), as it counts each single-threaded task's wall
        wall = time.perf_counter() - start
        self.busy_s += max(wall, time.process_time() - cpu_start) if threads > 1 else wall
        result = {"parts": sorted(self.parts), "feature": feature, "threshold": threshold,
                  "gain": gain, "left": left, "right": right, "busy_s": self.busy_s,
                  "peak_bytes": self.peak_bytes}
        if not keep:
            self.hist = None  # free the batch's memory before the next batch arrives
        return result

    def take(self, columns, rows: list, keys: list, round_no: int) -> bool:
        """Keep, as the next round's parents, the columns of the batch `best` just answered:
        parent i (under ``keys[i]``) is ``columns[sum(rows[:i]):sum(rows[:i + 1])]``, dense, in
        this actor's memory (subtraction.py); frees the histogram. False when it has none (the
        actor restarted since): those children are counted in full."""
        hist, self.hist = self.hist, None
        if hist is None or self.shape is None:
            return False
        columns, bounds = np.asarray(columns, np.int64), np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        for key, lo, hi in zip(keys, bounds[:-1], bounds[1:]):
            self.held[tuple(key)] = (round_no, dense_partial(hist[columns[lo:hi]]))
        return True

    def give(self, keys: list) -> list:
        """The held parents under `keys`, for another actor that derives from them (None for
        one this actor no longer holds: it restarted since); they are no longer held here."""
        return [self._pop_held(key) for key in keys]

    def forget(self) -> None:
        """Drop every held parent (the tree is done, or the run resumed)."""
        self.held = {}

    def pid(self) -> int:
        import os
        return os.getpid()

    def ping(self) -> bool:
        return True
