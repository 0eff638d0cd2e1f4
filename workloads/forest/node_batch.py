"""One node batch of a round, planned: everything its phases 2 and 3 need (`NodeBatch`).

A round's frontier is cut into node batches that keep to the memory budget (batch_plan.py);
each batch is then planned once here, on the driver: its compact histogram columns (one per
node and class present there, node by node), their count width, the phase-2 jobs (data
partition x feature partition), each histogram actor's share of the columns and what it needs
to pick its nodes' splits, and the nodes derived by subtraction (subtraction.py) with the
parents they start from. train.py's RoundRunner runs the plan; nothing here talks to Ray but
the puts of what every task of the batch reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import ray

from .subtraction import plan_derivations

COUNT_DTYPES = {1: "uint8", 2: "uint16", 4: "int32"}  # a histogram cell's width in bytes -> its dtype


@dataclass
class NodeBatch:
    """Batch `index` of round `depth`, planned by `NodeBatch.plan`."""
    depth: int
    index: int
    pool: tuple  # the tree's candidate (offsets, thresholds)
    selection: dict  # the examples each data unit trains on
    data_parts: list  # data partitions: each a list of block refs
    traversal: object  # ref: the partial tree's split fields, broadcast to every task
    nodes: object  # ref: the batch's node ids
    column_of: object  # ref: (node, class) -> its column, -1 where absent or derived
    jobs: list  # (data partition, feature partition) of each phase-2 task
    feature_bounds: list  # feature partition p is pool features [bounds[p], bounds[p + 1])
    node_bounds: list  # actor k reduces batch nodes [node_bounds[k], node_bounds[k + 1])
    column_bounds: list  # ... and their columns [column_bounds[k], column_bounds[k + 1])
    col_start: np.ndarray  # node i's columns start at col_start[i]
    col_class: np.ndarray  # each column's class
    itemsize: int  # bytes of a histogram cell (the widest node's count needs)
    derived: np.ndarray  # per batch node: derived from its parent, not counted by phase 2
    inits: list  # per actor: the parents its derived nodes start from (subtraction.route_inits)
    keep: bool  # the reducers keep this batch's columns as the next round's parents
    # per actor: (columns, features, bins, dtype), extended by the runner with the ref of its
    # parents and the round number before the resets are sent (HistogramPool.send_resets)
    shapes: list
    best_args: list  # per actor: phase 3's arguments (histogram_actor.best)
    feature_parts: dict = field(default_factory=dict)  # (f0, f1) -> refs of that pool part

    @property
    def dtype(self) -> str:
        return COUNT_DTYPES[self.itemsize]

    def data_part_of(self, job: int) -> list:
        """The block refs that phase-2 job `job` reads."""
        return self.data_parts[self.jobs[job][0]]

    def feature_part(self, f0: int, f1: int) -> tuple:
        """Refs of the pool's features [f0, f1), put in the object store once per batch: every
        data partition's task takes the same part, and passed by value each task pickled its own
        copy on the driver (the paper shape's 2,000 x 50 thresholds are 400 KB, past Ray's 100 KB
        for an argument sent inline, so each was also a new object): 224 such tasks took 0.91 s
        of the driver's CPU against 0.24 s from one put (docs/forest.md, "A round")."""
        if (f0, f1) not in self.feature_parts:
            offsets, thresholds = self.pool
            self.feature_parts[(f0, f1)] = (ray.put(offsets[f0:f1]), ray.put(thresholds[f0:f1]))
        return self.feature_parts[(f0, f1)]

    @classmethod
    def plan(cls, batch: list, node_bounds: list, itemsize: int, counts_of: dict, weights, *, depth: int,
             index: int, pool: tuple, feature_partitions: int, data_parts: list, selection: dict, traversal,
             parents, reducer_nodes: list | None, keep: bool, min_child_examples: int) -> NodeBatch:
        """Plan batch `batch` (frontier nodes, shared among actors at `node_bounds`), whose class
        counts are `counts_of`; `parents`: the ParentStore its derived nodes start from, fetched by
        reducers on `reducer_nodes` (None: one node); `keep`: its columns become parents."""
        offsets, thresholds = pool
        n_actors = len(node_bounds) - 1
        present = np.stack([counts_of[n] for n in batch]) > 0
        col_start = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
        column_of = np.where(present, np.cumsum(present, axis=1) - 1 + col_start[:-1, None], -1).astype(np.int32)
        col_class = np.nonzero(present)[1].astype(np.int32)
        column_bounds = [int(col_start[i]) for i in node_bounds]
        derivations = plan_derivations(parents, batch, node_bounds, col_start, col_class, reducer_nodes)
        column_of[derivations["derived"]] = -1  # phase 2 counts only what is not derived
        n_bins = thresholds.shape[1] + 1
        return cls(
            depth=depth, index=index, pool=pool, selection=selection, data_parts=data_parts, traversal=traversal,
            nodes=ray.put(np.asarray(batch, np.int64)), column_of=ray.put(column_of),
            jobs=[(d, p) for p in range(feature_partitions) for d in range(len(data_parts))],
            feature_bounds=[f * len(offsets) // feature_partitions for f in range(feature_partitions + 1)],
            node_bounds=node_bounds, column_bounds=column_bounds, col_start=col_start, col_class=col_class,
            itemsize=itemsize, derived=derivations["derived"], inits=derivations["inits"], keep=keep,
            shapes=[(column_bounds[k + 1] - column_bounds[k], len(offsets), n_bins, COUNT_DTYPES[itemsize])
                    for k in range(n_actors)],
            best_args=[(col_start[node_bounds[k]:node_bounds[k + 1] + 1] - col_start[node_bounds[k]],
                        col_class[column_bounds[k]:column_bounds[k + 1]], weights, min_child_examples,
                        derivations["pairs"][k]) for k in range(n_actors)])
