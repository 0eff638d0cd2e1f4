"""Histogram subtraction (as in LightGBM's and XGBoost's hist methods): of two siblings, the
larger child's histogram is its parent's minus the smaller child's, so a round below the root
counts only the examples of each pair's smaller child and derives the other.

Every example of a split node goes to exactly one child, and counts are integers, so a derived
histogram equals the one phase 2 would have counted, cell for cell: the trees are identical.

Where the parents live: on the driver, between round d (where they were summed, in a histogram
actor or, in a small round, on the driver) and round d+1 (where they are used). After phase 4
of a batch the driver takes, from whoever summed it, each split node's columns of the classes
its larger child holds, when both children go on to the next frontier and the columns fit in
what is left of ``forest.memory_budget_mb`` (counted as dense counts, what the columns take once
an actor starts from them; a node that does not fit has both children counted in full). Nothing
of it is checkpointed.

Parents travel and are held in the shuffle's partial form (shuffle.py): an actor's columns go
to the driver and back to an actor. On several nodes that is across them, and they go encoded
(dense or sparse, whichever is smaller): dense, they were 2.5x the shuffle's bytes (1.2 GB
against 0.49 GB for the mid shape's tree; deep in the tree a parent's cells are mostly zero). On
one node they stay dense: through shared memory a copy costs less than the encoding's passes.

In round d+1 a larger child is derived when its parent is held and its sibling falls in the
same node batch and the same actor's share (else both are counted in full):
  * phase 2's tasks skip its examples (its rows of `column_of` are -1);
  * its columns start as the parent's (`init`, sent with the actor's reset, so a restarted or
    reset actor gets them again), phase-2 partials fill the sibling's columns, and before phase
    3 each of its columns has the sibling's column of the same class subtracted (`pairs`).
A batch's counts are as narrow as its *children* need (shuffle.count_dtype), while a parent's
can be wider: the parent is cast to that width modulo 2^bits and the subtraction wraps modulo
2^bits, which is exact because the true result (a child's count) fits the width.

Falls back to full counting: in a tree's first round (no parent), in the first round after a
resume (the store is not checkpointed), for the children of a node whose histogram could not be
taken (its actor died or was restarted between phase 3 and the take), and where the store is full.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Parent:
    """What the driver keeps of a split node: the columns of its larger child's classes."""
    sibling: int           # the smaller child, counted by phase 2
    classes: np.ndarray    # (k,) the larger child's classes (ascending: its column order)
    counts: dict           # (k, features, bins) the parent's counts of those classes, a partial (shuffle.py)
    nbytes: int            # those counts' bytes dense: what the memory budget counts


class ParentStore:
    """The parents' histograms held on the driver between two rounds, keyed by the child to derive."""

    def __init__(self, budget_bytes: int, enabled: bool = True):
        self.budget_bytes, self.enabled = int(budget_bytes), bool(enabled)
        self.held: dict[int, Parent] = {}
        self.peak_bytes = 0  # the most held at once since `reset_peak` (dense)
        self.wire_bytes = 0  # encoded bytes taken since `reset_peak`: each goes to the driver and back

    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.held.values())

    def clear(self) -> None:
        self.held = {}

    def reset_peak(self) -> None:
        self.peak_bytes, self.wire_bytes = self.nbytes(), 0

    def release(self, nodes) -> None:
        """Forget the parents of `nodes` (their round is done with them)."""
        for n in nodes:
            self.held.pop(int(n), None)

    def requests(self, tree, batch, col_start, col_class, node_bounds, itemsize: int, n_features: int,
                 n_bins: int, next_frontier: set) -> dict:
        """After phase 4 of a batch: which columns to take from each reducer (actor k, or the
        driver as 0). A node is kept when it was split, both children are in `next_frontier`,
        and its larger child's columns fit in what is left of the budget (node order).
        Returns {k: [(larger child, smaller child, classes, columns relative to k's slice,
        their bytes dense)]}."""
        if not self.enabled:
            return {}
        room = self.budget_bytes - self.nbytes()
        out: dict[int, list] = {}
        for i, node in enumerate(batch):
            left, right = tree.left[node], tree.right[node]
            if left < 0 or left not in next_frontier or right not in next_frontier:
                continue
            n_left, n_right = tree.counts[left].sum(), tree.counts[right].sum()
            large, small = (left, right) if n_left > n_right else (right, left)  # a tie derives the right
            classes = np.nonzero(tree.counts[large] > 0)[0]
            cost = len(classes) * n_features * n_bins * itemsize
            if cost > room:
                continue
            room -= cost
            own = col_class[col_start[i]:col_start[i + 1]]
            columns = col_start[i] + np.searchsorted(own, classes)
            k = int(np.searchsorted(node_bounds, i, side="right") - 1)
            out.setdefault(k, []).append((int(large), int(small), classes, columns - col_start[node_bounds[k]], cost))
        return out

    def keep(self, wanted: list, taken) -> None:
        """Store what a reducer returned for `wanted` (its columns, stacked in order, a partial:
        shuffle.dense_partial or encode_partial); `taken` None (the actor lost its histogram) keeps nothing:
        those children are counted in full."""
        from .shuffle import encoded_bytes, slice_rows

        if taken is None or int(taken["shape"][0]) != sum(len(w[2]) for w in wanted):
            return
        self.wire_bytes += encoded_bytes(taken)
        row = 0
        for large, small, classes, _, cost in wanted:
            self.held[large] = Parent(small, classes, slice_rows(taken, row, row + len(classes)), cost)
            row += len(classes)
        self.peak_bytes = max(self.peak_bytes, self.nbytes())


def plan_derivations(store: ParentStore, batch: list, node_bounds: list, col_start: np.ndarray,
                     col_class: np.ndarray) -> dict:
    """Which nodes of a node batch are derived, and what each actor needs for them.

    Returns {"derived": (B,) bool, "inits": per actor [(first column, parent columns)],
    "pairs": per actor (P, 2) int64 (derived column, sibling column of the same class)},
    columns relative to the actor's slice."""
    n_actors = len(node_bounds) - 1
    derived = np.zeros(len(batch), bool)
    inits: list = [[] for _ in range(n_actors)]
    pairs: list = [[] for _ in range(n_actors)]
    slot_of = {int(n): i for i, n in enumerate(batch)}
    actor_of = np.searchsorted(node_bounds, np.arange(len(batch)), side="right") - 1
    for i, node in enumerate(batch):
        parent = store.held.get(int(node))
        j = slot_of.get(parent.sibling) if parent is not None else None
        if j is None or actor_of[j] != actor_of[i]:
            continue
        mine, theirs = col_class[col_start[i]:col_start[i + 1]], col_class[col_start[j]:col_start[j + 1]]
        if not np.array_equal(mine, parent.classes):
            continue  # cannot happen (the classes come from the same counts); count it in full
        k = actor_of[i]
        base = col_start[node_bounds[k]]
        derived[i] = True
        inits[k].append((int(col_start[i] - base), parent.counts))
        common = np.intersect1d(mine, theirs)
        pairs[k] += [(col_start[i] + np.searchsorted(mine, c) - base,
                      col_start[j] + np.searchsorted(theirs, c) - base) for c in common]
    return {"derived": derived, "inits": inits,
            "pairs": [np.asarray(p, np.int64).reshape(-1, 2) for p in pairs]}


def apply_init(hist: np.ndarray, init) -> None:
    """Start derived columns as their parents' (partials: shuffle.py), cast modulo 2^bits to the
    batch's width."""
    from .shuffle import place_partial

    for col, parent in init or ():
        place_partial(hist, col, parent)


def subtract_siblings(hist: np.ndarray, pairs) -> None:
    """hist[derived] -= hist[sibling] for each (derived, sibling) column pair, in place (wraps
    modulo 2^bits, exact: see the module docstring); one column at a time, no big temporaries."""
    for derived, sibling in np.asarray(pairs if pairs is not None else [], np.int64).reshape(-1, 2):
        np.subtract(hist[derived], hist[sibling], out=hist[derived])
