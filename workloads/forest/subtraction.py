"""Histogram subtraction (as in LightGBM's and XGBoost's hist methods): of two siblings, the
larger child's histogram is its parent's minus the smaller child's, so a round below the root
counts only the examples of each pair's smaller child and derives the other.

Every example of a split node goes to exactly one child, and counts are integers, so a derived
histogram equals the one phase 2 would have counted, cell for cell: the trees are identical.

Where the parents live: where they were summed. After phase 4 of a batch the driver asks
whoever summed it (a histogram actor or, in a small round, the driver itself) to keep each split
node's columns of the classes its larger child holds, when both children go on to the next
frontier and the columns fit in what is left of ``forest.memory_budget_mb`` (counted as dense
counts, what the columns take once an actor starts from them; a node that does not fit has both
children counted in full). An actor keeps its parents in its own memory (`take`), dense; the
driver holds only where each is (`Held`). In round d+1 an actor that derives from a parent it
holds starts from it in place; one held by another actor comes in one object per pair of actors
and batch (`give`), straight from actor to actor, crossing nodes only where the two actors are on
different nodes (`round/parent_wire_bytes` counts those bytes): a node partition's children fall
mostly in the same partition. Before, every parent went to the driver and back each round,
encoded across nodes: the mid shape's tree spent 7-8 s of its 40 s in phase 4 on two nodes
against 1.5 s on one. Nothing of it is checkpointed.

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
taken (its actor died or was restarted between phase 3 and the take), where the store is full,
and for a whole node batch one of whose parents could not be fetched (its node was lost with its
object store: the actor's reset says so, and the batch is planned again without parents).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ParentsLost(RuntimeError):
    """A parent's counts could not be had (its actor restarted, or its node is gone): the batch
    that needed them is counted in full."""


@dataclass(frozen=True)
class Held:
    """A parent kept by histogram actor `actor` under `key` (HistogramActor.take)."""
    actor: int
    key: tuple


@dataclass
class Parent:
    """What the driver keeps of a split node: the columns of its larger child's classes."""
    sibling: int           # the smaller child, counted by phase 2
    classes: np.ndarray    # (k,) the larger child's classes (ascending: its column order)
    counts: object         # (k, features, bins) the parent's counts of those classes, a dense partial
                           # (shuffle.py) on the driver, or `Held` by the actor that summed them
    nbytes: int            # those counts' bytes dense: what the memory budget counts
    node: str | None = None  # the node that holds them (None: one node)


class ParentStore:
    """The parents' histograms held on the driver between two rounds, keyed by the child to derive."""

    def __init__(self, budget_bytes: int, enabled: bool = True):
        self.budget_bytes, self.enabled = int(budget_bytes), bool(enabled)
        self.held: dict[int, Parent] = {}
        self.peak_bytes = 0  # the most held at once since `reset_peak` (dense)
        self.wire_bytes = 0  # bytes of parents fetched from another node since `reset_peak`

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

    def keep(self, wanted: list, parts, node: str | None = None) -> None:
        """Hold what a reducer took for `wanted`: one partial (or where an actor holds it) per
        parent, in order, on `node`; `parts` None (the actor lost its histogram) keeps nothing:
        those children are counted in full."""
        if parts is None or len(parts) != len(wanted):
            return
        for (large, small, classes, _, cost), part in zip(wanted, parts):
            self.held[large] = Parent(small, classes, part, cost, node)
        self.peak_bytes = max(self.peak_bytes, self.nbytes())


def plan_derivations(store: ParentStore, batch: list, node_bounds: list, col_start: np.ndarray,
                     col_class: np.ndarray, actor_nodes: list | None = None) -> dict:
    """Which nodes of a node batch are derived, and what each actor needs for them.

    Returns {"derived": (B,) bool, "inits": per actor [(first column, parent columns or where
    they are held)], "pairs": per actor (P, 2) int64 (derived column, sibling column of the same
    class)}, columns relative to the actor's slice. `actor_nodes[k]`: the node of actor k; a
    parent held on another node adds its bytes to the store's `wire_bytes`."""
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
        if actor_nodes is not None and parent.node is not None and actor_nodes[k] != parent.node:
            store.wire_bytes += parent.nbytes
        common = np.intersect1d(mine, theirs)
        pairs[k] += [(col_start[i] + np.searchsorted(mine, c) - base,
                      col_start[j] + np.searchsorted(theirs, c) - base) for c in common]
    return {"derived": derived, "inits": inits,
            "pairs": [np.asarray(p, np.int64).reshape(-1, 2) for p in pairs]}


def route_inits(inits: list, give, reducers: list | None = None) -> list:
    """The inits of a batch's reducers (plan_derivations), as each receives them: a parent held
    by the reducer itself as ("held", key); held by another actor j, as (ref, i), element i of one
    ``give(j, keys)`` ref per (j, reducer); on the driver, as it is. `reducers[k]`: the actor
    index of reducer k (default k; None: the driver, which holds no actor's parents)."""
    out = []
    for k, init in zip(reducers if reducers is not None else range(len(inits)), inits):
        asked: dict = {}
        for _, part in init:
            if isinstance(part, Held) and part.actor != k:
                asked.setdefault(part.actor, []).append(part.key)
        refs = {j: give(j, keys) for j, keys in asked.items()}
        routed = []
        for col, part in init:
            if not isinstance(part, Held):
                routed.append((col, part))
            elif part.actor == k:
                routed.append((col, ("held", part.key)))
            else:
                routed.append((col, (refs[part.actor], asked[part.actor].index(part.key))))
        out.append(routed)
    return out


def resolve_init(init, own=None, timeout_s: float = 120.0) -> list:
    """`init` as (first column, partial) pairs: ("held", key) from ``own(key)`` (the reducer's
    own parents, each given up as it is used), (ref, i) element i of a `give`'s list (one ray.get
    for all); raises ParentsLost where a parent is missing (its actor restarted since it took it)
    or its object cannot be had."""
    import ray

    refs = list({part[0].hex(): part[0] for _, part in init or ()
                 if isinstance(part, tuple) and isinstance(part[0], ray.ObjectRef)}.values())
    try:
        fetched = dict(zip((r.hex() for r in refs), ray.get(refs, timeout=timeout_s))) if refs else {}
    except (ray.exceptions.RayError, TimeoutError) as exc:
        raise ParentsLost(str(exc)[:200]) from None
    out = []
    for col, part in init or ():
        if isinstance(part, tuple) and part[0] == "held":
            part = own(part[1]) if own is not None else None
        elif isinstance(part, tuple):
            part = fetched[part[0].hex()][part[1]]
        if part is None:
            raise ParentsLost(f"a parent starting column {col} is gone")
        out.append((col, part))
    return out


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
