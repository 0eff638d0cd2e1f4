"""Breadth-first training rounds (2.2): four phases per round, on Ray tasks and actors.

Round i splits every frontier node at depth i:
  [1] phase 1  tasks, one per data partition: re-associate each example with its node by
               traversing the partial tree from the root; count classes per node. In
               round 0 these counts are the normalisation constants (class priors).
  [2] phase 2  tasks, one per (data partition x feature partition), with the whole tree:
               (node, feature, threshold bin, class) histograms by the numba kernel; each
               task sends every histogram actor the slice of its nodes.
  [3] phase 3  histogram actors, one per node partition: sum the slices, pick the best
               feature and threshold per node.
  [4] phase 4  driver: split nodes, grow the next (sparse) frontier, checkpoint.
Phases 2-3 run once per node *batch*: batches are sized so that no task's and no
actor's histogram exceeds `forest.memory_budget_mb` (section 3's "gigabytes at the
bottom of the tree"), which is why the frontier is never materialised as one histogram.
Histograms are compact: one column per (node, class seen there by phase 1).
"""
from __future__ import annotations

import time

import numpy as np
import ray

from .body_parts import NUM_PARTS
from .data_unit import tree_selection
from .histogram_actor import HistogramActor
from .tree import Tree, save_checkpoint


class TrainingInterrupted(RuntimeError):
    """Raised after `forest.stop_after_rounds` rounds (a deliberate crash, for resume tests)."""


def _set_threads(threads: int) -> None:
    import numba
    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


def _reassociate(block, tree_arrays, selection, background_mm):
    """Selected example indices of a block and the node each one reaches, (K,), (K,)."""
    from .histogram_kernels import assign_nodes

    ex = np.nonzero(tree_selection(block, **selection))[0]
    nodes = assign_nodes(block["depths"], block["ex_img"][ex], block["ex_y"][ex],
                         block["ex_x"][ex], tree_arrays["offsets"], tree_arrays["threshold"],
                         tree_arrays["left"], tree_arrays["right"], background_mm)
    return ex, nodes


def phase1_task(tree_arrays, selection, background_mm, threads, *blocks):
    """Class counts (N, C) int64 of the examples reaching each of the tree's N nodes."""
    start = time.perf_counter()
    _set_threads(threads)
    n_nodes = len(tree_arrays["left"])
    counts = np.zeros(n_nodes * NUM_PARTS, np.int64)
    for block in blocks:
        ex, nodes = _reassociate(block, tree_arrays, selection, background_mm)
        counts += np.bincount(nodes.astype(np.int64) * NUM_PARTS + block["ex_cls"][ex],
                              minlength=n_nodes * NUM_PARTS)
    return counts.reshape(n_nodes, NUM_PARTS), time.perf_counter() - start


def phase2_task(tree_arrays, column_of, n_columns, offsets, thresholds, column_bounds,
                selection, background_mm, threads, *blocks):
    """Partial histograms of one (data partition, feature partition) for one node batch.

    column_of (N, C) int32: histogram column of (node, class), -1 outside the batch.
    Returns one (columns of actor k, F_part, T+1) int32 slice per histogram actor k,
    then a stats dict (busy seconds, example-features evaluated, histogram bytes).
    """
    from .histogram_kernels import accumulate_histograms

    start = time.perf_counter()
    _set_threads(threads)
    hist = np.zeros((n_columns, len(offsets), thresholds.shape[1] + 1), np.int32)
    example_features = 0
    for block in blocks:
        ex, nodes = _reassociate(block, tree_arrays, selection, background_mm)
        columns = column_of[nodes, block["ex_cls"][ex]]
        mine = columns >= 0
        # grouping examples by column keeps one node's histogram rows hot in cache
        order = np.argsort(columns[mine], kind="stable")
        ex, columns = ex[mine][order], columns[mine][order]
        accumulate_histograms(hist, block["depths"], block["ex_img"][ex], block["ex_y"][ex],
                              block["ex_x"][ex], columns, offsets, thresholds, background_mm)
        example_features += len(ex) * len(offsets)
    parts = [hist[column_bounds[k]:column_bounds[k + 1]] for k in range(len(column_bounds) - 1)]
    stats = {"busy_s": time.perf_counter() - start, "example_features": example_features,
             "hist_bytes": hist.nbytes}
    return (*parts, stats)


def partitions_at(forest_cfg: dict, depth: int) -> dict:
    """Partition degrees (data_units, features, nodes) in force at `depth` (footnote 2:
    they change per depth); later `partitions_by_depth` entries override earlier ones."""
    degrees = dict(forest_cfg["partitions"])
    for entry in sorted(forest_cfg.get("partitions_by_depth") or [], key=lambda e: e["from_depth"]):
        if depth >= entry["from_depth"]:
            degrees.update({k: v for k, v in entry.items() if k != "from_depth"})
    return degrees


def plan_batches(nodes: list, columns: list, n_features: int, max_features_per_task: int,
                 n_bins: int, n_actors: int, budget_bytes: int) -> list:
    """Split frontier `nodes` (with `columns` histogram columns each) into batches such that
    a task's histogram (batch columns x its features) and every actor's (its columns x all
    features) fit in `budget_bytes`. Returns [(batch nodes, node bounds per actor)].

    Actors are filled in node order up to an even share (+ one node) of the batch's columns;
    the batch is capped at n_actors x (actor capacity - one node) so that this always
    fits in n_actors actors. A single node always fits (validate checks the budget).
    """
    cell = n_bins * 4
    task_cap = budget_bytes // (max_features_per_task * cell)
    actor_cap = budget_bytes // (n_features * cell)
    batch_cap = min(task_cap, n_actors * max(actor_cap - NUM_PARTS + 1, 1))
    batches, current, used = [], [], 0
    for node, k in zip(nodes, columns):
        if current and used + k > batch_cap:
            batches.append(current)
            current, used = [], 0
        current.append((node, k))
        used += k
    if current:
        batches.append(current)
    planned = []
    for batch in batches:
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
        planned.append(([n for n, _ in batch], bounds))
    return planned


class RoundRunner:
    """Drives the rounds of one forest on a live Ray session."""

    def __init__(self, block_refs: list, forest_cfg: dict, strategy_cfg: dict, seed: int,
                 checkpoint_path, on_round=None, hooks: dict | None = None):
        self.block_refs, self.cfg, self.seed = block_refs, forest_cfg, seed
        self.workers = int(strategy_cfg.get("num_workers", 1))
        self.cpus = float(strategy_cfg.get("cpus_per_worker", 1))
        self.max_failures = int(strategy_cfg.get("max_failures", 3))
        self.checkpoint_path, self.on_round, self.hooks = checkpoint_path, on_round, hooks or {}
        self.background = np.float32(forest_cfg["background_mm"])
        self.actors: list = []
        self.rounds_this_run = 0
        self.actor_replays = 0  # phase-3 retries after an actor died or lost its partials
        self._phase1_task = ray.remote(phase1_task).options(num_cpus=self.cpus, max_retries=self.max_failures)
        self._phase2_task = ray.remote(phase2_task)

    # ---- actors -------------------------------------------------------------------
    def _new_actor(self):
        # num_cpus=0: actors only sum and scan histograms, the CPUs belong to phase-2 tasks.
        return ray.remote(HistogramActor).options(
            num_cpus=0, max_restarts=self.max_failures, max_task_retries=0).remote()

    def _ensure_actors(self, count: int) -> None:
        while len(self.actors) < count:
            self.actors.append(self._new_actor())

    def _reset(self, k: int, shape) -> None:
        """Empty actor k's histograms for a new batch; an actor that is still restarting after
        a failure in the previous batch gets time to come back (or is replaced)."""
        for _ in range(self.max_failures + 2):
            try:
                ray.get(self.actors[k].reset.remote(*shape))
                return
            except ray.exceptions.RayActorError:  # incl. ActorUnavailableError (restarting)
                self._revive(k)
        raise RuntimeError(f"histogram actor {k} failed {self.max_failures + 2} times")

    def _revive(self, k: int) -> None:
        """After a failed call: wait for Ray to restart actor k, or replace it."""
        try:
            ray.get(self.actors[k].ping.remote(), timeout=30)
        except Exception:
            ray.kill(self.actors[k], no_restart=True)
            self.actors[k] = self._new_actor()

    def _collect(self, k, shape, sent: dict, best_args: tuple):
        """Phase 3 result of actor k, replaying `sent` {part_id: (f0, ref)} into a restarted
        or recreated actor until it has summed exactly the partials that were sent."""
        for attempt in range(self.max_failures + 2):
            try:
                if attempt > 0:
                    self.actor_replays += 1
                    ray.get(self.actors[k].reset.remote(*shape))
                    for part_id, (f0, ref) in sent.items():
                        self.actors[k].add.remote(part_id, f0, ref)
                result = ray.get(self.actors[k].best.remote(*best_args))
                if result["parts"] == sorted(sent):
                    return result
            except ray.exceptions.RayActorError:  # incl. ActorUnavailableError (restarting)
                self._revive(k)
        raise RuntimeError(f"histogram actor {k} failed {self.max_failures + 2} times")

    # ---- one tree -----------------------------------------------------------------
    def _data_partitions(self, degree: int) -> list[list]:
        degree = max(1, min(degree, len(self.block_refs)))
        return [list(p) for p in np.array_split(np.array(self.block_refs, dtype=object), degree)]

    def _phase1(self, tree_arrays_ref, data_parts, selection):
        outs = ray.get([self._phase1_task.remote(tree_arrays_ref, selection, self.background, self.cpus, *p)
                        for p in data_parts])
        return sum(o[0] for o in outs), sum(o[1] for o in outs)

    def _phases_2_3(self, tree_arrays_ref, n_tree_nodes, batch, node_bounds, counts, pool,
                    degrees, data_parts, selection, weights, depth, batch_index):
        """Histograms and best splits of one node batch; returns (results per actor, stats)."""
        offsets, thresholds = pool
        n_actors = len(node_bounds) - 1
        self._ensure_actors(n_actors)
        # compact columns: one per (node, class present at that node), node by node
        present = counts[batch] > 0
        col_start = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
        column_of = np.full((n_tree_nodes, NUM_PARTS), -1, np.int32)
        column_of[batch] = np.where(present, np.cumsum(present, axis=1) - 1 + col_start[:-1, None], -1)
        col_class = np.nonzero(present)[1].astype(np.int32)
        column_bounds = [int(col_start[b]) for b in node_bounds]
        feature_bounds = [f * len(offsets) // degrees["features"] for f in range(degrees["features"] + 1)]
        n_bins = thresholds.shape[1] + 1
        shapes = [(column_bounds[k + 1] - column_bounds[k], len(offsets), n_bins) for k in range(n_actors)]
        best_args = [(col_start[node_bounds[k]:node_bounds[k + 1] + 1] - col_start[node_bounds[k]],
                      col_class[column_bounds[k]:column_bounds[k + 1]], weights, self.cfg["min_child_examples"])
                     for k in range(n_actors)]
        for k in range(n_actors):
            self._reset(k, shapes[k])
        column_ref = ray.put(column_of)
        sent = [dict() for _ in range(n_actors)]
        stats, in_flight = [], {}
        jobs = [(d, p) for p in range(degrees["features"]) for d in range(len(data_parts))]
        start = time.perf_counter()

        def forward(stat_ref):
            part_id, f0, refs = in_flight.pop(stat_ref)
            stats.append(ray.get(stat_ref))
            for k in range(n_actors):  # the shuffle: each actor gets its nodes' slice
                self.actors[k].add.remote(part_id, f0, refs[k])
                sent[k][part_id] = (f0, refs[k])

        for part_id, (d, p) in enumerate(jobs):
            while len(in_flight) >= self.workers:  # at most num_workers tasks at a time
                forward(ray.wait(list(in_flight), num_returns=1)[0][0])
            f0, f1 = feature_bounds[p], feature_bounds[p + 1]
            refs = self._phase2_task.options(num_returns=n_actors + 1, num_cpus=self.cpus,
                                        max_retries=self.max_failures).remote(
                tree_arrays_ref, column_ref, int(col_start[-1]), offsets[f0:f1], thresholds[f0:f1],
                column_bounds, selection, self.background, self.cpus, *data_parts[d])
            in_flight[refs[-1]] = (part_id, f0, refs[:-1])
        while in_flight:
            forward(ray.wait(list(in_flight), num_returns=1)[0][0])
        phase2_s = time.perf_counter() - start
        if "after_phase2" in self.hooks:
            self.hooks["after_phase2"](self, depth, batch_index)
        start = time.perf_counter()
        results = [self._collect(k, shapes[k], sent[k], best_args[k]) for k in range(n_actors)]
        phase3_s = time.perf_counter() - start
        return results, {"phase2_s": phase2_s, "phase3_s": phase3_s,
                         "task_busy_s": sum(s["busy_s"] for s in stats),
                         "actor_busy_s": sum(r["busy_s"] for r in results),
                         "example_features": sum(s["example_features"] for s in stats),
                         "hist_peak_bytes": max([s["hist_bytes"] for s in stats]
                                                + [r["peak_bytes"] for r in results])}

    def train_tree(self, tree_index: int, pool, state: dict) -> None:
        """Grow tree `tree_index` from `state` (fresh or resumed), checkpointing every round.

        state: the checkpoint dict (tree.save_checkpoint); updated in place.
        """
        cfg = self.cfg
        offsets, thresholds = pool
        selection = {"seed": self.seed, "tree_index": tree_index,
                     "image_fraction": cfg["image_fraction"], "pixel_fraction": cfg["pixel_fraction"]}
        budget = int(cfg["memory_budget_mb"] * 2**20)
        if state["partial"] is None:
            tree, frontier, depth = Tree(NUM_PARTS), [0], 0
            tree.add_node(0, np.zeros(NUM_PARTS))
        else:
            tree, frontier, depth = Tree.from_arrays(state["partial"]), list(state["frontier"]), state["next_depth"]
        while frontier and depth < cfg["max_depth"]:
            round_start = time.perf_counter()
            degrees = partitions_at(cfg, depth)
            data_parts = self._data_partitions(int(degrees["data_units"]))
            tree_arrays_ref = ray.put(tree.arrays())  # the tree is broadcast to every task
            n_tree_nodes = len(tree)  # phase 4 grows `tree` mid-round; tasks see this snapshot
            # [1] phase 1: scan the data: node class counts, class priors at the root
            counts, phase1_busy = self._phase1(tree_arrays_ref, data_parts, selection)
            if depth == 0:
                tree.counts[0] = counts[0]
                priors = counts[0] / max(counts[0].sum(), 1)
                present = priors > 0
                weights = np.where(present, 1.0 / (present.sum() * np.where(present, priors, 1.0)), 0.0)
                state["class_weights"].append(weights)
            elif not np.array_equal(counts[frontier], np.array(tree.counts)[frontier]):
                raise RuntimeError("re-association disagrees with the counts of the last split")
            weights = state["class_weights"][tree_index]
            phase1_s = time.perf_counter() - round_start
            active = [n for n in frontier if counts[n].sum() >= cfg["min_examples"]]
            # [2]+[3] per node batch: histograms in tasks, sums and best splits in actors
            columns = [int((counts[n] > 0).sum()) for n in active]
            batches = plan_batches(active, columns, len(offsets), -(-len(offsets) // degrees["features"]),
                                   thresholds.shape[1] + 1, int(degrees["nodes"]), budget)
            totals = {"phase2_s": 0.0, "phase3_s": 0.0, "task_busy_s": phase1_busy,
                      "actor_busy_s": 0.0, "example_features": 0, "hist_peak_bytes": 0}
            # [4] phase 4 (interleaved per batch): split nodes, grow the next frontier
            next_frontier, phase4_s = [], 0.0
            for b, (batch, node_bounds) in enumerate(batches):
                results, stats = self._phases_2_3(tree_arrays_ref, n_tree_nodes, batch, node_bounds,
                                                  counts, pool, degrees, data_parts, selection,
                                                  weights, depth, b)
                for key in totals:
                    totals[key] = max(totals[key], stats[key]) if key == "hist_peak_bytes" \
                        else totals[key] + stats[key]
                start = time.perf_counter()
                for node, (f, t, gain, left, right) in zip(batch, _by_node(results)):
                    if f < 0 or gain <= cfg["min_gain"]:
                        continue  # stays a leaf
                    children = tree.split(node, f, offsets[f], thresholds[f, t], left, right)
                    next_frontier += [c for c in children if depth + 1 < cfg["max_depth"]
                                      and tree.counts[c].sum() >= cfg["min_examples"]]
                phase4_s += time.perf_counter() - start
            frontier, depth = next_frontier, depth + 1
            state.update(partial=tree.arrays(), frontier=frontier, next_depth=depth)
            start = time.perf_counter()
            save_checkpoint(self.checkpoint_path, state)
            phase4_s += time.perf_counter() - start
            wall = time.perf_counter() - round_start
            if self.on_round:
                cell = (thresholds.shape[1] + 1) * 4
                self.on_round(tree_index, depth - 1, {
                    "round/tree": tree_index, "round/depth": depth - 1,
                    "round/phase1_s": phase1_s, "round/phase2_s": totals["phase2_s"],
                    "round/phase3_s": totals["phase3_s"], "round/phase4_s": phase4_s,
                    "round/total_s": wall, "round/frontier_size": len(active),
                    "round/node_batches": len(batches),
                    "round/examples": int(counts[active].sum()) if active else 0,
                    "round/example_features_per_s": totals["example_features"] / max(totals["phase2_s"], 1e-9),
                    "round/hist_peak_bytes": totals["hist_peak_bytes"],
                    "round/hist_unbatched_bytes": sum(columns) * len(offsets) * cell,
                    "round/effective_parallelism": (totals["task_busy_s"] + totals["actor_busy_s"]) / wall,
                })
            self.rounds_this_run += 1
            if cfg.get("stop_after_rounds") and self.rounds_this_run >= cfg["stop_after_rounds"]:
                raise TrainingInterrupted(f"stopped after {self.rounds_this_run} rounds as configured")
        state["trees"].append(tree.arrays())
        state.update(partial=None, frontier=[], next_depth=0)
        save_checkpoint(self.checkpoint_path, state)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def _by_node(results):
    """Flatten per-actor phase-3 results, in node (slot) order, to (f, t, gain, left, right)."""
    for r in results:
        for i in range(len(r["feature"])):
            yield int(r["feature"][i]), int(r["threshold"][i]), float(r["gain"][i]), r["left"][i], r["right"][i]
