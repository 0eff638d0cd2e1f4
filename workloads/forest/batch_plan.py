"""How a round's work is cut (2.2, section 3): partition degrees per depth, and node batches
whose histograms keep to ``forest.memory_budget_mb`` in every task and every histogram actor."""
from __future__ import annotations

from .body_parts import NUM_PARTS


def partitions_at(forest_cfg: dict, depth: int) -> dict:
    """Partition degrees (data_units, features, nodes) in force at `depth` (footnote 2:
    they change per depth); later `partitions_by_depth` entries override earlier ones."""
    degrees = dict(forest_cfg["partitions"])
    for entry in sorted(forest_cfg.get("partitions_by_depth") or [], key=lambda e: e["from_depth"]):
        if depth >= entry["from_depth"]:
            degrees.update({k: v for k, v in entry.items() if k != "from_depth"})
    return degrees


def fill_workers(degrees: dict, workers: int, n_features: int, running: int | None = None) -> dict:
    """``degrees`` sized to the workers: enough phase-2 tasks for every worker, and a histogram
    actor (node partition) for every worker that can run at once (``running``: the workers the
    cluster's CPUs hold, default all; an actor reserves CPUs, so more actors than that would wait
    for CPUs that never come free, and a round would hang on them). Degrees set for a few cores left most of a big
    machine idle: 16 workers ran 8 tasks a round, 4 below depth 10 (an effective parallelism of
    3.3 on 16 cores), and phase 3, which runs alone between phase 2 and the driver's phase 4, ran
    on the 2-4 actors of the defaults whatever the workers.

    Tasks: where there are fewer than workers the features are split further, never below one
    offset a part: feature partitions are disjoint histograms, so unlike more data units they add
    no partials to ship or sum. Actors: at least one per worker (the seed's "several hundred
    parts for ... nodes" on 235 machines, footnote 2); each then sums and searches a 1/workers
    share of the frontier's columns, and a batch may hold workers x the memory budget. The tree
    depends on neither (the counts are the same integers wherever they are summed)."""
    units, features, nodes = int(degrees["data_units"]), int(degrees["features"]), int(degrees["nodes"])
    reducers = min(workers, running if running is not None else workers)
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

    Actors are filled in node order up to an even share (+ one node) of the batch's columns;
    the batch is capped at n_actors x (actor capacity - one node) so that this always
    fits in n_actors actors. A single node always fits (validate checks the budget).
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
