"""How a round's work is cut (2.2, section 3): partition degrees per depth, and node batches
whose histograms keep to ``forest.memory_budget_mb`` in every task and every histogram actor."""
from __future__ import annotations

import math

from .body_parts import NUM_PARTS


def partitions_at(forest_cfg: dict, depth: int) -> dict:
    """Partition degrees (data_units, features, nodes) in force at `depth` (footnote 2:
    they change per depth); later `partitions_by_depth` entries override earlier ones."""
    degrees = dict(forest_cfg["partitions"])
    for entry in sorted(forest_cfg.get("partitions_by_depth") or [], key=lambda e: e["from_depth"]):
        if depth >= entry["from_depth"]:
            degrees.update({k: v for k, v in entry.items() if k != "from_depth"})
    return degrees


def fill_workers(degrees: dict, workers: int, n_features: int, running: int | None = None,
                 actors_per_worker: float = 1.0) -> dict:
    """``degrees`` sized to the workers: enough phase-2 tasks for every worker, and a histogram
    actor (node partition) for every worker that can run at once (``running``: the workers the
    cluster's CPUs hold, default all; an actor reserves CPUs, so more actors than that would wait
    for CPUs that never come free, and a round would hang on them). Degrees set for a few cores
    left most of a big machine idle: 16 workers ran 8 tasks a round, 4 below depth 10 (an
    effective parallelism of 3.3 on 16 cores), and phase 3, which runs alone between phase 2 and
    the driver's phase 4, ran on the 2-4 actors of the defaults whatever the workers.

    Tasks: where there are fewer than workers the features are split further, never below one
    offset a part: feature partitions are disjoint histograms, so unlike more data units they add
    no partials to ship or sum. Actors: at least one per worker (the seed's "several hundred
    parts for ... nodes" on 235 machines, footnote 2); each then sums and searches a 1/workers
    share of the frontier's columns, and a batch may hold workers x the memory budget.
    ``actors_per_worker`` (forest.actors_per_worker) scales that floor: 0.25 gives sixteen
    workers four actors (each start and each task's slice to every actor cost CPU seconds that
    grow with the actors, phase 3 divides by them: a trade to measure on the machine), 0 leaves
    ``nodes`` as configured. The tree depends on none of it (the counts are the same integers
    wherever they are summed)."""
    units, features, nodes = int(degrees["data_units"]), int(degrees["features"]), int(degrees["nodes"])
    # rounded first: 0.1 x 30 is 3.0000000000000004 in floats, which ceil makes 4
    reducers = math.ceil(round(actors_per_worker * min(workers, running if running is not None else workers), 9))
    if units * features >= workers and nodes >= reducers:
        return degrees
    if units * features < workers:
        features = max(features, min(n_features, -(-workers // units)))
    return dict(degrees, features=features, nodes=max(nodes, reducers))


def plan_batches(nodes: list, columns: list, n_features: int, max_features_per_task: int,
                 n_bins: int, n_actors: int, budget_bytes: int, itemsizes: list | None = None) -> list:
    """Split frontier `nodes` (with `columns` histogram columns each, and cells of `itemsizes`
    bytes: count_dtype of each node's largest column; 4 when not given) into batches such that
    a task's histogram (batch columns x its features) and every actor's (its columns x all
    features) fit in `budget_bytes`. Returns [(batch nodes, node bounds per actor, itemsize)];
    a batch's cells are as wide as its widest node needs.

    Each batch's nodes are shared among its actors in node order, as evenly as their columns
    allow, siblings kept together (`balanced_bounds`); where that does not fit an actor, actors
    are filled up to an even share (+ one node) of the batch's columns, which always fits: the
    batch is capped at n_actors x (actor capacity - one node). A single node always fits
    (validate checks the budget).
    """
    itemsizes = itemsizes or [4] * len(nodes)

    def caps(itemsize):
        cell = n_bins * itemsize
        actor_cap = budget_bytes // (n_features * cell)
        task_cap = budget_bytes // (max_features_per_task * cell)
        return min(task_cap, n_actors * max(actor_cap - NUM_PARTS + 1, 1)), actor_cap

    batches, current, used, width = [], [], 0, 0
    for node, k, itemsize in zip(nodes, columns, itemsizes):
        if current and used + k > caps(max(width, itemsize))[0]:
            batches.append((current, width))
            current, used, width = [], 0, 0
        current.append((node, k))
        used, width = used + k, max(width, itemsize)
    if current:
        batches.append((current, width))
    planned = []
    for batch, width in batches:
        actor_cap = caps(width)[1]
        bounds = balanced_bounds([n for n, _ in batch], [k for _, k in batch], n_actors, actor_cap)
        if bounds is not None:
            planned.append(([n for n, _ in batch], bounds, width))
            continue
        total = sum(k for _, k in batch)
        share = -(-total // min(n_actors, len(batch)))
        target = min(actor_cap, share + NUM_PARTS - 1)
        bounds, filled = [0], 0
        for i, (_, k) in enumerate(batch):
            if filled + k > target and i > bounds[-1]:
                bounds.append(i)
                filled = 0
            filled += k
        bounds.append(len(batch))
        assert len(bounds) - 1 <= n_actors, "batch plan needs more actors than configured"
        planned.append(([n for n, _ in batch], bounds, width))
    return planned


def balanced_bounds(nodes: list, columns: list, n_actors: int, actor_cap: int) -> list | None:
    """Node bounds sharing a batch's columns among at most ``n_actors`` actors in node order, each
    share within one sibling pair of the batch's columns / actors, and no sibling pair split;
    None where a share would exceed ``actor_cap`` columns.

    Phase 3 lasts as long as its fullest actor, and the fill up to an even share + one node
    (plan_batches' fallback) left actors idle once they were many: 16 actors over 64 nodes filled
    9, the fullest with twice the even share. Siblings (a split's two children, ids 2i+1 and
    2i+2: model.Tree.split) stay in one actor because the larger is derived from the parent minus
    the smaller only where both are (subtraction.py); apart, both were counted in full."""
    units, i = [], 0  # (first index, columns) of each sibling pair or lone node, in node order
    while i < len(nodes):
        pair = i + 1 < len(nodes) and nodes[i] % 2 == 1 and nodes[i + 1] == nodes[i] + 1
        units.append((i, columns[i] + (columns[i + 1] if pair else 0)))
        i += 2 if pair else 1
    parts, total = min(n_actors, len(units)), sum(columns)
    bounds, part, start = [0], 0, 0
    for first, size in units:
        # the unit's actor: where its middle column falls among `parts` equal shares
        j = min(parts - 1, (2 * start + size) * parts // (2 * max(total, 1)))
        if j > part and first > 0:
            bounds.append(first)
            part = j
        start += size
    bounds.append(len(nodes))
    if any(sum(columns[a:b]) > actor_cap for a, b in zip(bounds[:-1], bounds[1:])):
        return None
    return bounds
