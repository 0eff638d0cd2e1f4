"""What one training round measured, phase by phase: `RoundTally`.

A round (train.py) notes its figures here as its phases end (the bin cache, phase 1, its plan,
each node batch's phases 2-3, phase 4 and the checkpoint), and `metrics` turns them into the
round's `round/` metrics (docs/forest.md, "Metrics"). Kept apart from the runner so that the
rounds' code reads as the four phases and this file as what is logged of them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .body_parts import NUM_PARTS

# what each node batch's phases 2-3 report (`batch_figures`), summed over a round's batches;
# the histogram peak is the largest of them, not a sum
BATCH_SUMS = ("phase2_s", "phase3_s", "phase2_tasks", "phase2_sparse_tasks", "task_busy_s", "actor_busy_s",
              "example_features", "shuffle_bytes", "dense_bytes")


def batch_figures(stats: list, phase2_s: float, phase3_s: float, actor_busy_s: float, reducer_bytes: list) -> dict:
    """A node batch's figures (BATCH_SUMS' and its histogram peak) from its phase-2 tasks' `stats`,
    its phases' wall times and its reducers' busy seconds; `reducer_bytes`: the histograms summed into."""
    return {"phase2_s": phase2_s, "phase3_s": phase3_s, "phase2_tasks": len(stats),
            "phase2_sparse_tasks": sum(bool(s.get("sparse")) for s in stats),
            "task_busy_s": sum(s["busy_s"] for s in stats), "actor_busy_s": actor_busy_s,
            "example_features": sum(s["example_features"] for s in stats),
            "shuffle_bytes": sum(s["shuffle_bytes"] for s in stats),
            "dense_bytes": sum(s["dense_bytes"] for s in stats),
            "hist_peak_bytes": max([s["hist_bytes"] for s in stats] + reducer_bytes)}


@dataclass
class RoundTally:
    """The figures of round `depth` of tree `tree`, from its start (made) to its end (`metrics`)."""
    tree: int
    depth: int
    cache: dict | None = None  # the tree's bin cache's figures (bytes, blocks: logged every round)
    start: float = field(default_factory=time.perf_counter)
    encode_s: float = 0.0  # the bin cache's build, in the round that built it (0 in the others)
    encode_busy: float = 0.0
    phase1_s: float = 0.0
    phase1_busy: float = 0.0
    phase4_s: float = 0.0
    derived_examples: int = 0  # examples of the nodes derived by subtraction, not counted
    parents_lost: int = 0  # node batches counted in full: a parent could not be had
    plan: dict = field(default_factory=dict)  # the round's shape (`planned`)
    sums: dict = field(default_factory=lambda: dict.fromkeys(BATCH_SUMS, 0))
    hist_peak_bytes: int = 0

    def encoded(self, cache: dict) -> None:
        """The tree's bin cache (its figures: `cache`) was built in this round, from its start until now."""
        self.cache, self.encode_s, self.encode_busy = cache, time.perf_counter() - self.start, cache["busy_s"]
        self.sums["task_busy_s"] += self.encode_busy

    def counted(self, busy_s: float, counts_bytes: int) -> None:
        """Phase 1: its tasks' busy seconds and the frontier counts' bytes (its wall: `phase1_s`)."""
        self.phase1_busy = busy_s
        self.sums["task_busy_s"] += busy_s
        self.sums["shuffle_bytes"] += counts_bytes

    def planned(self, examples: int, columns: list, itemsizes: list, pool_shape: tuple, data_partitions: int,
                feature_partitions: int, batches: list, small: bool, phase3_threads: int,
                tree_nodes: int) -> None:
        """The round's shape: its active frontier's examples and columns (and their count widths),
        the candidate pool's (features, thresholds), its partitions and node batches, whether
        the driver reduced it (small), each actor's phase-3 threads, the tree's nodes before it."""
        node_partitions = 0 if small else max((len(nb) - 1 for _, nb, _ in batches), default=0)
        self.plan = {"examples": examples, "columns": columns, "itemsizes": itemsizes, "pool_shape": pool_shape,
                     "data_partitions": data_partitions, "feature_partitions": feature_partitions,
                     "node_batches": len(batches), "node_partitions": node_partitions,
                     "phase3_threads": 0 if small else phase3_threads, "tree_nodes": tree_nodes}

    def add_batch(self, stats: dict, derived_examples: int) -> None:
        """One node batch's phases 2-3 (`stats`), of whose examples `derived_examples` were derived."""
        for key in BATCH_SUMS:
            self.sums[key] += stats[key]
        self.hist_peak_bytes = max(self.hist_peak_bytes, stats["hist_peak_bytes"])
        self.derived_examples += derived_examples

    def metrics(self, parents, locality: dict) -> dict:
        """The round's `round/` metrics, its wall time ending now. `parents`: the ParentStore,
        its peak and wire bytes since the round's `reset_peak`; `locality`: UnitHomes.round_figures."""
        wall = time.perf_counter() - self.start
        s, p = self.sums, self.plan
        n_features, n_thresholds = p["pool_shape"]
        examples = p["examples"]
        return {
            "round/tree": self.tree, "round/depth": self.depth,
            "round/bin_cache_s": self.encode_s, "round/bin_cache_bytes": self.cache["bytes"],
            "round/bin_cache_blocks": self.cache["blocks"],
            "round/phase1_s": self.phase1_s, "round/phase2_s": s["phase2_s"],
            "round/phase3_s": s["phase3_s"], "round/phase4_s": self.phase4_s,
            "round/total_s": wall, "round/frontier_size": len(p["columns"]),
            "round/node_batches": p["node_batches"],
            "round/examples": examples,
            # histogram subtraction: examples phase 2 counted, the share of the round's
            # example-feature evaluations derived instead, the parents' bytes on the driver
            "round/examples_histogrammed": examples - self.derived_examples,
            "round/subtraction_saved": self.derived_examples / max(examples, 1),
            "round/parent_hist_bytes": parents.peak_bytes,
            # ... and the bytes of those this round's reducers fetched from another
            # node's store (subtraction.py): beside the shuffle, the round's other bytes
            "round/parent_wire_bytes": parents.wire_bytes,
            # node batches counted in full because a parent was gone with its actor's
            # memory (restarted, or lost with its node): same tree, no derivation
            "round/parents_lost": self.parents_lost,
            "round/example_features_per_s": s["example_features"] / max(s["phase2_s"], 1e-9),
            "round/hist_peak_bytes": self.hist_peak_bytes,
            "round/hist_unbatched_bytes": sum(c * i for c, i in zip(p["columns"], p["itemsizes"]))
            * n_features * (n_thresholds + 1),
            "round/hist_columns": sum(p["columns"]), "round/data_partitions": p["data_partitions"],
            "round/feature_partitions": p["feature_partitions"],
            # histogram actors the round's batches used (at most the partition degree,
            # sized to the running workers: batch_plan.fill_workers); 0: the driver reduced
            "round/node_partitions": p["node_partitions"],
            # each actor's threads in phase 3 (its share of the running workers' cores)
            "round/phase3_threads": p["phase3_threads"],
            # the shuffle: encoded partials to actors + phase-1 frontier counts, and what
            # dense partials with counts for every node of the tree would have been
            "round/shuffle_bytes": s["shuffle_bytes"],
            # locality (locality.py): bytes of data units (blocks, bin caches) that this
            # round's tasks read from a node other than their own (the units' one fetch to
            # their home included), tasks that ran off their units' home, nodes that ran
            # tasks; and the processes that have run this run's phase-2 tasks so far
            **locality,
            "round/shuffle_dense_bytes": s["dense_bytes"] + p["data_partitions"] * p["tree_nodes"] * NUM_PARTS * 8,
            "round/effective_parallelism": (s["task_busy_s"] + s["actor_busy_s"]) / wall,
            # its two parts: the tasks' busy seconds (encode, phases 1-2) and the actors'
            # (sums, splits). On 16 cores the busy time itself tripled from 4 workers to 16
            # (docs/scaling.md, 2026-12-04): which of the two grew is the next question
            "round/task_busy_s": s["task_busy_s"], "round/actor_busy_s": s["actor_busy_s"],
            "round/phase2_tasks": s["phase2_tasks"],
            # ... of which counted without a histogram (sparse_counts.py)
            "round/phase2_sparse_tasks": s["phase2_sparse_tasks"],
            # the same per phase: phase 1's tasks over its wall time (0 where the counts
            # came from the last split), phases 2-3's tasks and actors over theirs
            "round/phase1_parallelism": self.phase1_busy / max(self.phase1_s, 1e-9),
            "round/phase23_parallelism": (s["task_busy_s"] - self.phase1_busy - self.encode_busy + s["actor_busy_s"])
                                          / max(s["phase2_s"] + s["phase3_s"], 1e-9),
        }
