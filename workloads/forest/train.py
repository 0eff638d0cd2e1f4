"""Breadth-first training rounds (2.2): four phases per round, on Ray tasks and actors.

Round i splits every frontier node at depth i:
  [1] phase 1  tasks, one per data partition: re-associate each example with its node by
               traversing the partial tree from the root; count classes per frontier node.
               In round 0 these counts are the normalisation constants (class priors);
               later rounds know them from the last split and scan only to verify
               (`forest.verify_counts`).
  [2] phase 2  tasks, one per (data partition x feature partition), with the whole tree:
               (node, feature, threshold bin, class) histograms by the numba kernel; each
               task sends every histogram actor the slice of its nodes.
  [3] phase 3  histogram actors, one per node partition: sum the slices, pick the best
               feature and threshold per node (all actors asked at once).
  [4] phase 4  driver: split nodes, grow the next (sparse) frontier, checkpoint.
Phases 2-3 run once per node *batch*: batches are sized so that no task's and no
actor's histogram exceeds `forest.memory_budget_mb` (section 3's "gigabytes at the
bottom of the tree"), which is why the frontier is never materialised as one histogram.
Histograms are compact: one column per (node, class seen there by phase 1).
Each tree first computes its bin cache (`forest.bin_cache_mb`): the threshold bin of every
example under every candidate feature, one byte each, held in the object store; phase 2 then
counts cached bins instead of evaluating eq. 1 again every round. A block whose cache does not
fit its share of the budget is evaluated on the fly every round, as in the paper (2.1).
Below the root, of two siblings only the smaller is counted in phase 2; the larger's histogram
is its parent's minus the smaller's (`forest.histogram_subtraction`, subtraction.py).

On several nodes every data unit has a home node: its encode, phase-1 and phase-2 tasks run
there and only partial histograms cross between nodes (locality.py, ``UnitHomes``: the homes,
where a task goes, what it read from another node).

The tasks' bodies are in round_tasks.py, the round's batches in batch_plan.py and each batch's
plan in node_batch.py, the histogram actors' lifecycle (start, reset, revive or replace) in
histogram_pool.py, the parents kept for subtraction in subtraction.py; `grow_forest` grows the T
trees of a run, each from its own candidate pool (`tree_pool`).

What a round measured is noted as its phases end in round_tally.py (``RoundTally``), which turns
it into the round's metrics.

Why one file of ~700 lines (the only workload source file over 450): ``RoundRunner`` is the
rounds' state (the actors, the homes, the bin cache, the parents kept, the stop flag) carried
through four phases that share it; every body that does not need that state has left for the
modules above.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time

import numpy as np
import ray

from orchard.api import background, say

from .avatar import focal_length_px
from .batch_plan import fill_workers, partitions_at, plan_batches
from .body_parts import NUM_PARTS
from .checkpoint import save_checkpoint
from .features import candidate_pool
from .histogram_pool import HistogramPool
from .locality import cpu_nodes, object_store_bytes, UnitHomes
from .model import Tree
from .node_batch import NodeBatch
from .round_tally import batch_figures, RoundTally
from .round_tasks import encode_task, phase1_task, phase2_task, traversal_arrays
from .shuffle import count_dtype, dense_partial
from .subtraction import apply_init, Held, ParentsLost, ParentStore, resolve_init, route_inits, subtract_siblings


MIN_TASK_CPUS = 0.05  # the least a phase-1/2 task reserves, whatever the actors take


class TrainingInterrupted(RuntimeError):
    """Raised after `forest.stop_after_rounds` rounds (a deliberate crash, for resume tests)."""


class RoundRunner:
    """Drives the rounds of one forest on a live Ray session.

    hooks (tests only): {"phase1" | "phase2" | "after_phase2" | "phase3" | "phase4":
    fn(runner, depth, batch_index)} called on the driver at that point of a round (phase2:
    after the first task's partials went out; phase3: after the first of two or more
    actors answered, the others asked and maybe still answering),
    and {"task_fault" | "encode_fault" | "best_fault": marker path} (see phase2_task; the
    best_fault kills the first actor to pick splits below the root, mid-answer).
    """

    def __init__(self, block_refs: list, forest_cfg: dict, strategy_cfg: dict, seed: int,
                 checkpoint_path, on_round=None, hooks: dict | None = None):
        self.block_refs, self.cfg, self.seed = block_refs, forest_cfg, seed
        self.workers = int(strategy_cfg.get("num_workers", 1))
        self.cpus = float(strategy_cfg.get("cpus_per_worker", 1))
        # workers the cluster's CPUs run at once (all of them inside a sweep trial's group, which
        # holds a bundle per worker): phase 3 gets a histogram actor for each (fill_workers)
        self.in_group = ray.util.get_current_placement_group() is not None
        self.cluster_cpus = float(ray.cluster_resources().get("CPU", 1))
        self.running = self.workers if self.in_group else \
            max(1, min(self.workers, int(self.cluster_cpus // max(self.cpus, 1e-9))))
        self.threads = max(1, int(round(self.cpus)))
        self.max_failures = int(strategy_cfg.get("max_failures", 3))
        self.checkpoint_path, self.on_round, self.hooks = checkpoint_path, on_round, hooks or {}
        self.background = np.float32(forest_cfg["background_mm"])
        # Inside a sweep trial every task and actor must stay in the trial's placement group
        # (captured, default scheduling); elsewhere actors reserve CPUs and spread over nodes.
        self.actor_cpus = 0.0 if self.in_group else float(forest_cfg.get("actor_cpus", 0.25))
        self.reducers = HistogramPool(self.actor_cpus, self.in_group, self.max_failures)
        self.stopping = threading.Event()  # set by the driver's main thread on an interrupt
        self.rounds_this_run = 0
        self.told_replaced = False  # the console was told that Ray replaced task processes (once a run)
        self.actor_replays = 0  # lost partials recomputed after an actor died or restarted
        self.actors_started_early = 0  # in the data step's last wave (start_actors_early)
        self.round_no = 0  # rounds begun by this runner, all trees: the generation of the actors' held parents
        self.tree_index = 0
        # the split nodes' histograms kept on the driver for the next round's subtraction
        self.parents = ParentStore(int(forest_cfg["memory_budget_mb"] * 2**20),
                                   forest_cfg.get("histogram_subtraction", True))
        self.takes: list = []  # the actors' takes of the last batches' parents, not yet collected
        self.bin_cache: dict = {}  # block ref -> its bin cache ref (None: on the fly), this tree's
        # each data unit's home node (locality.py), chosen on the first encode, and what tasks
        # read away from it; no homes on one node and inside a sweep trial's placement group
        self.homes = UnitHomes(self.in_group)
        # The round tasks are pure functions of their object-store inputs: an OSError inside one
        # comes from its node going away under it (a worker whose raylet has died fails to reach
        # its sockets before it is killed, and Ray calls that the task's own error, not a lost
        # worker), so it is retried like a lost worker, up to max_failures times.
        retried = {"retry_exceptions": [OSError]}
        self._encode_task = ray.remote(**retried)(encode_task)
        self._phase1_task = ray.remote(**retried)(phase1_task)
        self._phase2_task = ray.remote(**retried)(phase2_task)

    def _degrees(self, depth: int, n_features: int) -> dict:
        """Partition degrees of a round at `depth`: the configured ones, sized to the workers."""
        return fill_workers(partitions_at(self.cfg, depth), self.workers, n_features, self.running,
                            float(self.cfg.get("actors_per_worker", 1.0)))

    @property
    def actors(self) -> list:
        """The histogram actors (phase 3's reducers), by node partition."""
        return self.reducers.actors

    # ---- resources ----------------------------------------------------------------
    def _check_actors_fit(self, n_actors: int) -> None:
        """Refuse node partitions whose actors' CPU shares leave no CPU for a phase-2 task: an
        actor Ray cannot place waits for ever, and the round with it (16 on 2 CPUs hung)."""
        from orchard.api import ConfigError

        if self.actor_cpus and self.actor_cpus * n_actors + MIN_TASK_CPUS > self.cluster_cpus:
            raise ConfigError("forest.partitions.nodes",
                              f"histogram actors that leave this cluster's {self.cluster_cpus:g} CPUs room for a task: "
                              f"{n_actors} actors x forest.actor_cpus {self.actor_cpus:g} = "
                              f"{self.actor_cpus * n_actors:g} CPUs; lower forest.partitions.nodes (or its "
                              "partitions_by_depth entries) or forest.actor_cpus")

    def _task_cpus(self) -> float:
        """CPUs a phase-1/2 task reserves: the run's budget (num_workers x cpus_per_worker)
        less the actors' share, so that actors and a full set of tasks fit together."""
        share = self.actor_cpus * len(self.actors) / max(self.workers, 1)
        return max(MIN_TASK_CPUS, round(self.cpus - share, 4))

    def _wait_one(self, refs: list):
        """The first of `refs` to finish. Every second it looks whether the run was interrupted;
        then the tasks are cancelled and the rounds stop: a thread left waiting inside Ray when
        the run stops Ray makes Ray end the process with status 1 (not 130/143)."""
        while True:
            ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
            if ready:
                return ready[0]
            if self.stopping.is_set():
                for ref in refs:
                    ray.cancel(ref, force=True)
                raise TrainingInterrupted("stopped: the run was interrupted")

    # ---- phases 2 and 3 of one node batch ------------------------------------------
    def _phase2(self, b: NodeBatch, targets: list, col_lo: int, col_hi: int, bounds: list, resets=None, hook=None):
        """Run every (data partition x feature partition) task of batch `b` over columns
        [col_lo, col_hi), split at `bounds` among actors `targets`; each task sends its slices
        to their actors itself (the shuffle), each summed after the actor's reset in `resets`
        (refs; None: done). The driver never holds a slice: it lives in the object store only
        until its actor has summed it. Returns (task stats, {actor: its adds' refs})."""
        stats, acks, in_flight = [], {k: [] for k in targets}, {}
        # put once: sixteen actor handles and resets pickled into each of a batch's tasks cost
        # the driver as much again as submitting it
        receivers = ray.put(([self.actors[k] for k in targets], list(resets or [None] * len(targets))))

        def forward(stat_ref):
            part_id = in_flight.pop(stat_ref)
            stats.append(ray.get(stat_ref))
            self.homes.ran(stats[-1]["node"], b.data_part_of(part_id), stats[-1]["pid"])
            for k, ack in zip(targets, stats[-1].pop("acks")):
                acks[k].append(ack)
            if hook and len(stats) == 1:
                hook(self, b.depth, b.index)

        # at most num_workers tasks at a time; with homes, each node's share of them, and the
        # next job is one whose node has a free slot (a global cap let one node idle while the
        # next job in line waited for the other)
        slots = self.homes.slots(self.workers, self.cpus)
        queued = list(enumerate(b.jobs))
        while queued:
            if self.stopping.is_set():
                raise TrainingInterrupted("stopped: the run was interrupted")
            busy = [self.homes.home_of(b.data_part_of(j)) for j in in_flight.values()]
            ready = [i for i, (_, (d, _)) in enumerate(queued)
                     if busy.count(node := self.homes.home_of(b.data_parts[d])) < slots.get(node, 1)]
            if not ready or len(in_flight) >= self.workers:
                forward(self._wait_one(list(in_flight)))
                continue
            part_id, (d, p) = queued.pop(ready[0])
            f0, f1 = b.feature_bounds[p], b.feature_bounds[p + 1]
            in_flight[self._submit_phase2(b, d, f0, f1, col_lo, col_hi, bounds, receivers, part_id)] = part_id
        while in_flight:
            forward(self._wait_one(list(in_flight)))
        return stats, acks

    def _submit_phase2(self, b: NodeBatch, d: int, f0: int, f1: int, col_lo: int, col_hi: int, bounds: list,
                       receivers=None, part_id: int = 0):
        """One phase-2 task of batch `b`: data partition `d`, features [f0, f1), columns
        [col_lo, col_hi) split at `bounds`. With `receivers` (the ref of the actors and their
        resets: it sends them its slices as task `part_id`'s, round_tasks.send_slices) the ref
        of its stats; without, its one slice's ref and then the stats' (the driver sums it:
        `_phases_2_3_on_driver`)."""
        offsets, thresholds = b.feature_part(f0, f1)
        return self._phase2_task.options(num_returns=1 if receivers else 2, num_cpus=self._task_cpus(),
                                         max_retries=self.max_failures,
                                         scheduling_strategy=self.homes.place(b.data_parts[d])).remote(
            b.traversal, b.nodes, b.column_of, col_lo, col_hi, offsets, thresholds, f0,
            bounds, b.dtype, b.selection, self.background, self.threads, self.hooks.get("task_fault"),
            receivers, part_id, *b.data_parts[d], *[self.bin_cache.get(ref) for ref in b.data_parts[d]])

    def _wait_all(self, refs: list) -> list:
        """ray.get(refs), interruptible as `_wait_one` is."""
        pending = list(refs)
        while pending:
            pending.remove(self._wait_one(pending))
        return ray.get(refs)

    def _ask_best(self, k: int, b: NodeBatch, fault=None):
        """Phase 3 of actor k: its nodes' best splits (a ref), on its share of the workers' cores."""
        return self.actors[k].best.remote(*b.best_args[k], keep=b.keep, fault=fault,
                                          threads=self._phase3_threads(len(b.shapes)))

    def _phase3_threads(self, n_actors: int) -> int:
        """Threads of each actor's split search: the cores of the workers the cluster runs at once,
        shared among the batch's actors (phase 3 runs while no task does). One each where a batch
        has an actor per worker (the default, once the frontier has a node for each); four each for
        sixteen workers' cores on four actors (forest.actors_per_worker=0.25). A batch of fewer
        nodes gets more threads than it can use (the search is parallel over its nodes)."""
        return max(1, int(self.running * self.threads) // max(n_actors, 1))

    def _collect(self, k: int, b: NodeBatch, asked) -> tuple[dict, list]:
        """Phase 3 result of actor k, already `asked` (a ref), or None when it lost partials.
        An actor that lost partials (it died or was restarted in phase 1, 2 or 3) is revived,
        reset, and only its share of the batch is recomputed by phase-2 tasks (deterministic),
        until it has summed every partial exactly once. Returns (result, stats of the
        recomputing tasks)."""
        c0, c1 = b.column_bounds[k], b.column_bounds[k + 1]
        expected, extra = list(range(len(b.jobs))), []
        for _ in range(self.max_failures + 2):
            try:
                if asked is None:
                    self.actor_replays += 1
                    if not self.reducers.reset(k, b.shapes[k]):
                        raise ParentsLost(f"actor {k}: a parent's counts could not be fetched")
                    stats, acks = self._phase2(b, [k], c0, c1, [0, c1 - c0])
                    extra += stats
                    if not self.reducers.acked(acks[k]):
                        continue
                    asked = self._ask_best(k, b)
                result, asked = ray.get(asked), None
                if result["parts"] == expected:
                    return result, extra
            except ray.exceptions.RayError:  # died in phase 3, or restarting
                asked = None
                self.reducers.revive(k)
        raise RuntimeError(f"histogram actor {k} failed {self.max_failures + 2} times")

    def _batch(self, traversal_ref, batch, node_bounds, itemsize, counts_of, pool, degrees, data_parts,
               selection, weights, depth, batch_index, on_driver: bool = False) -> NodeBatch:
        """Plan one node batch (node_batch.py); its reducers run on the driver's node when
        `on_driver` (a small round), else where its actors are."""
        # where each reducer runs: a parent held on another node's store is fetched across
        reducer_nodes = None
        if self.homes.by_unit:
            reducer_nodes = [ray.get_runtime_context().get_node_id()] if on_driver else \
                [self.reducers.node_of(k) for k in range(len(node_bounds) - 1)]
        return NodeBatch.plan(batch, node_bounds, itemsize, counts_of, weights, depth=depth, index=batch_index,
                              pool=pool, feature_partitions=int(degrees["features"]), data_parts=data_parts,
                              selection=selection, traversal=traversal_ref, parents=self.parents,
                              reducer_nodes=reducer_nodes,
                              keep=self.parents.enabled and depth + 1 < self.cfg["max_depth"],
                              min_child_examples=self.cfg["min_child_examples"])

    def _phases_2_3_on_driver(self, b: NodeBatch) -> tuple[list, dict]:
        """Phases 2 and 3 of a small round's batch: one phase-2 task per data partition over
        every column, and the driver, not actors, sums their partials and picks the splits.

        Below `forest.small_round_example_features` a round is a fraction of a second of
        kernel, and the actors' hop (reset, one add per task, acknowledgements, one phase-3
        call each) costs more than the work. The batch is planned for one reducer, so the
        driver's histogram keeps to the memory budget. Integer counts: the same tree as the
        actors give. A task that dies is re-run by Ray; nothing lives in an actor to lose."""
        from .histogram_kernels import best_splits
        from .shuffle import add_partial

        n_features, total = len(b.pool[0]), b.column_bounds[-1]
        start = time.perf_counter()
        refs = []
        for d, _ in b.jobs:  # one feature partition: a job per data partition
            if self.stopping.is_set():
                raise TrainingInterrupted("stopped: the run was interrupted")
            refs.append(self._submit_phase2(b, d, 0, n_features, 0, total, [0, total]))
        # the parents: the driver's own, and those the actors hold, given (ParentsLost)
        init = resolve_init(route_inits(b.inits, self._give, reducers=[None])[0])
        hist = np.zeros(b.shapes[0][:3], b.dtype)
        apply_init(hist, init)  # derived nodes start from their parents
        stats, pending = [], {stat: (part, d) for (part, stat), (d, _) in zip(refs, b.jobs)}
        while pending:  # sum each partial as it arrives; its object is freed right after
            stat_ref = self._wait_one(list(pending))
            part, d = pending.pop(stat_ref)
            add_partial(hist, 0, ray.get(part))
            stats.append(ray.get(stat_ref))
            self.homes.ran(stats[-1]["node"], b.data_parts[d], stats[-1]["pid"])
        phase2_s = time.perf_counter() - start
        start = time.perf_counter()
        col_start, col_class, weights, min_child, pairs = b.best_args[0]
        subtract_siblings(hist, pairs)
        feature, threshold, gain, left, right = best_splits(hist, col_start, col_class,
                                                            np.asarray(weights, np.float64), int(min_child),
                                                            len(weights))
        phase3_s = time.perf_counter() - start
        result = {"feature": feature, "threshold": threshold, "gain": gain, "left": left, "right": right,
                  "hist": hist if b.keep else None}  # the next round's parents are taken from it
        return [result], batch_figures(stats, phase2_s, phase3_s, phase3_s, [hist.nbytes])

    def _phases_2_3(self, b: NodeBatch) -> tuple[list, dict]:
        """Histograms in tasks, sums and best splits in the histogram actors, for batch `b`;
        returns (results per actor, stats)."""
        n_actors = len(b.shapes)
        self.reducers.ensure(n_actors)
        # derived nodes' parents go with the batch's reset: an actor's own by key, another actor's
        # given to it (subtraction.py), the driver's as they are
        inits = route_inits(b.inits, self._give)
        b.shapes = [(*shape, ray.put(init) if init else None, self.round_no)
                       for shape, init in zip(b.shapes, inits)]
        depth, batch_index, column_bounds = b.depth, b.index, b.column_bounds
        start = time.perf_counter()
        resets = self.reducers.send_resets(b.shapes)  # the driver does not wait for them
        stats, acks = self._phase2(b, list(range(n_actors)), 0, column_bounds[-1], column_bounds, resets,
                                   hook=self.hooks.get("phase2"))
        ok = [self.reducers.acked(acks[k]) for k in range(n_actors)]  # every slice summed (or lost)
        self._settle_takes()
        if not self.reducers.confirm(resets):
            raise ParentsLost(f"depth {depth} batch {batch_index}: a parent's counts could not be fetched")
        phase2_s = time.perf_counter() - start
        if "after_phase2" in self.hooks:
            self.hooks["after_phase2"](self, depth, batch_index)
        start = time.perf_counter()
        # every actor that summed its partials is asked at once: each picks its nodes' splits on
        # its own core (asked one after the other, phase 3 was a quarter of a 2-worker round)
        fault = self.hooks.get("best_fault") if depth >= 1 else None
        asked = [self._ask_best(k, b, fault) if ok[k] else None for k in range(n_actors)]
        results = []
        for k in range(n_actors):
            result, extra = self._collect(k, b, asked[k])
            results.append(result)
            stats += extra
            if k == 0 and n_actors > 1 and "phase3" in self.hooks:
                self.hooks["phase3"](self, depth, batch_index)
        phase3_s = time.perf_counter() - start
        return results, batch_figures(stats, phase2_s, phase3_s, sum(r["busy_s"] for r in results),
                                          [r["peak_bytes"] for r in results])

    def _give(self, j: int, keys: list):
        """The ref of actor j's held parents under `keys`, for another reducer."""
        return self.actors[j].give.remote(keys)

    def _keep_parents(self, b: NodeBatch, batch: list, results: list, tree, next_frontier: list, small: bool) -> None:
        """After phase 4 of batch `b`: have its reducers keep the columns that the next round
        derives its larger children from (subtraction.py): the driver, from its histogram in a
        small round; else each actor, in its own memory (one `take` each, which also frees its
        histogram), the driver noting where. An actor that died or restarted since phase 3 keeps
        nothing: those children are counted in full."""
        if not b.keep:
            return
        _, n_features, n_bins, *_ = b.shapes[0]
        wanted = self.parents.requests(tree, batch, b.col_start, b.col_class, b.node_bounds,
                                       b.itemsize, n_features, n_bins, set(next_frontier))
        if small:
            here = ray.get_runtime_context().get_node_id() if self.homes.by_unit else None
            for k, want in wanted.items():
                self.parents.keep(want, [dense_partial(results[0]["hist"][w[3]]) for w in want], here)
            results[0]["hist"] = None
            return
        # the driver does not wait for the takes: it notes each parent as held where it was asked
        # to be, and an actor runs the next round's reset after its take. A take that failed (the
        # actor died or restarted since phase 3) leaves the parent missing where the next reset
        # looks for it: that reset answers False and its batch is counted in full (`confirm`)
        for k in range(len(results)):
            want = wanted.get(k, [])
            keys = [(self.tree_index, w[0]) for w in want]
            columns = np.concatenate([w[3] for w in want]) if want else np.zeros(0, np.int64)
            self.takes.append(self.actors[k].take.remote(columns, [len(w[2]) for w in want], keys, self.round_no))
            if want:
                self.parents.keep(want, [Held(k, key) for key in keys], self.reducers.node_of(k))

    def _settle_takes(self) -> None:
        """Collect the takes sent since the last batch (long done by then): their answers are
        read by the resets that use the parents; an error here is an actor that died, which
        `_collect` handles, and is only kept out of Ray's log of errors nobody read."""
        takes, self.takes = self.takes, []
        for ref in takes:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                pass

    def _forget_parents(self) -> None:
        """No parent is held any more: on the driver and in the actors."""
        self._settle_takes()
        self.parents.clear()
        for actor in self.actors:
            actor.forget.remote()

    # ---- one tree -----------------------------------------------------------------
    def start_actors(self, first_depth: int = 0) -> None:
        """Start every histogram actor the rounds from `first_depth` on will ask for: an actor's
        process start (Python, the workload's imports, numba's threading layer) then overlaps
        other work instead of stalling the round that first needs it (2-3 s in rounds 2 and 8 on
        2 cores). A tree's first round does this (its encode hides the starts); a run also calls
        `start_actors_early` in its data step's last wave."""
        depths = range(first_depth, max(self.cfg["max_depth"], first_depth + 1))
        n_actors = max(int(self._degrees(d, int(self.cfg["n_offsets"]))["nodes"]) for d in depths)
        self._check_actors_fit(n_actors)  # refused whatever the data: the same config at full size would hang
        if self.rounds_may_need_actors():
            self.reducers.ensure(n_actors)

    def rounds_may_need_actors(self) -> bool:
        """Whether any round of this run can be big enough for the histogram actors. A round's
        work is its examples times the tree's offsets, at most every image's sampled pixels
        (`train_images` x `examples_per_image`) times `n_offsets`; below
        `forest.small_round_example_features` the driver sums (`_phases_2_3_on_driver`), so a
        run all of whose rounds are small (`debug=smoke`) starts no actor: each would cost a
        process start, about a CPU-second, for nothing. A round that needs them starts them
        anyway (`_phases_2_3`)."""
        cfg = self.cfg
        most = int(cfg["train_images"]) * int(cfg["examples_per_image"]) * int(cfg["n_offsets"])
        return most >= cfg.get("small_round_example_features", 0)

    def start_actors_early(self, first_depth: int = 0) -> int:
        """`start_actors` before the data units are all made, from the data step's last wave
        (data.load_blocks' `on_last_wave`), whose idle cores take the actors' starts off the
        first round's (on 16 cores, sixteen actors' ~1 CPU-s each beside sixteen encode tasks of
        ~1 s). Only where the actors' places do not wait for the units: one node, or a sweep
        trial's placement group; on several nodes each actor goes to a node that holds units
        (`_homes`), known once they are made. Returns the actors started here."""
        if not self.in_group and len(cpu_nodes()) > 1:
            return 0
        before = len(self.actors)
        self.start_actors(first_depth)
        self.actors_started_early = len(self.actors) - before
        return self.actors_started_early

    def _data_partitions(self, degree: int) -> list[list]:
        """`degree` lists of block refs, by home where the units have homes (UnitHomes.partitions)."""
        return self.homes.partitions(self.block_refs, degree)

    def _homes(self) -> None:
        """Choose each unit's home once per run (locality.py); the actors go to the home nodes."""
        if self.homes.choose(self.block_refs):
            self.reducers.nodes = self.homes.nodes()
            if self.homes.by_unit:
                # Pinned tasks must never wait on an actor's CPU share: a restarted actor (its node
                # lost) may come back on any node, and a task pinned there would wait for a CPU
                # that never comes free (soft affinity falls back only for a dead or too-small
                # node). With homes the actors reserve no CPU; tasks take their full share.
                self.actor_cpus = self.reducers.actor_cpus = 0.0

    def _encode_bins(self, pool, selection) -> dict:
        """The tree's bin cache: one encode task per worker, each caching its blocks' codes in
        order while they fit its share of `forest.bin_cache_mb` (kept by reference, in the object
        store); the rest are evaluated on the fly every round. Returns the tasks' busy seconds,
        the blocks cached and the cache's bytes."""
        budget = int(round(self.cfg.get("bin_cache_mb", 0) * 2**20))
        self.bin_cache = {}
        out = {"busy_s": 0.0, "blocks": 0, "bytes": 0}
        if budget <= 0:
            return out
        offsets, thresholds = pool
        parts = self._data_partitions(self.workers)
        refs = [self._encode_task.options(num_returns=len(p) + 1, num_cpus=self._task_cpus(),
                                          max_retries=self.max_failures,
                                          scheduling_strategy=self.homes.place(p)).remote(
            offsets, thresholds, selection, self.background, self.threads,
            self.homes.cache_budget(p, budget, len(self.block_refs)),
            self.hooks.get("encode_fault"), *p)
            for p in parts]
        for part, part_refs, stats in zip(parts, refs, self._wait_all([r[-1] for r in refs])):
            self.homes.ran(stats["node"], part)
            self.bin_cache.update((block, code) for block, code, kept in zip(part, part_refs, stats["cached"]) if kept)
            out = {"busy_s": out["busy_s"] + stats["busy_s"], "blocks": out["blocks"] + sum(stats["cached"]),
                   "bytes": out["bytes"] + stats["bytes"]}
        self.homes.cached(self.bin_cache)
        return out

    def _phase1(self, traversal_ref, frontier, data_parts, selection, depth):
        """[1] class counts (K, C) of the K frontier nodes; (counts, busy s, bytes returned)."""
        frontier_ref = ray.put(np.asarray(frontier, np.int64))
        refs = [self._phase1_task.options(num_cpus=self._task_cpus(), max_retries=self.max_failures,
                                          scheduling_strategy=self.homes.place(p)).remote(
                traversal_ref, frontier_ref, selection, self.background, self.threads, *p) for p in data_parts]
        if "phase1" in self.hooks:
            self.hooks["phase1"](self, depth, 0)
        outs = self._wait_all(refs)
        for o, p in zip(outs, data_parts):
            self.homes.ran(o[2], p)
        return sum(o[0] for o in outs), sum(o[1] for o in outs), sum(o[0].nbytes for o in outs)

    def train_tree(self, tree_index: int, pool, state: dict) -> None:
        """Grow tree `tree_index` from `state` (fresh or resumed), checkpointing every round.

        state: the checkpoint dict (checkpoint.save_checkpoint); updated in place.
        """
        cfg = self.cfg
        selection = {"seed": self.seed, "tree_index": tree_index,
                     "image_fraction": cfg["image_fraction"], "pixel_fraction": cfg["pixel_fraction"]}
        budget = self._tree_budget(pool)
        self.tree_index = tree_index
        self._forget_parents()  # a tree's first round, or the first after a resume: nothing to derive from
        if state["partial"] is None:
            tree, frontier, depth = Tree(NUM_PARTS), [0], 0
            tree.add_node(0, np.zeros(NUM_PARTS))
        else:
            tree, frontier, depth = Tree.from_arrays(state["partial"]), list(state["frontier"]), state["next_depth"]
        self.start_actors(depth)  # those the data step's last wave did not start already
        self.bin_cache = {}  # the last tree's cache is freed (its refs dropped)
        cache = None  # this tree's bin cache's figures: it is built in its first round of this run
        while frontier and depth < cfg["max_depth"]:
            tally = RoundTally(tree_index, depth, cache)
            self.round_no += 1
            self._homes()
            self.homes.begin_round()
            if cache is None:
                cache = self._encode_bins(pool, selection)
                tally.encoded(cache)
            # children are created in order; the frontier is sorted for lookups
            frontier = self._round(tree, sorted(frontier), depth, pool, selection, state, budget, tally)
            depth += 1
            state.update(partial=tree.arrays(), frontier=frontier, next_depth=depth)
            start = time.perf_counter()
            save_checkpoint(self.checkpoint_path, state)
            tally.phase4_s += time.perf_counter() - start
            if self.on_round:
                self.on_round(tree_index, depth - 1, tally.metrics(self.parents, self.homes.round_figures()))
            self._tell_replaced_processes()
            self.rounds_this_run += 1
            if cfg.get("stop_after_rounds") and self.rounds_this_run >= cfg["stop_after_rounds"]:
                raise TrainingInterrupted(f"stopped after {self.rounds_this_run} rounds as configured")
        self._forget_parents()
        self.bin_cache = {}
        state["trees"].append(tree.arrays())
        state.update(partial=None, frontier=[], next_depth=0)
        save_checkpoint(self.checkpoint_path, state)

    def _tell_replaced_processes(self) -> None:
        """Say once a run, on the console, when the phase-2 tasks have run in more processes than
        there are workers: Ray replaced worker processes, and each new one paid its start and the
        kernels' loads again. A lost worker or node does that once; Ray killing idle workers between
        rounds does it every round (1.6x the training time at sixteen workers, docs/scaling.md), on
        a cluster whose nodes were started with Ray's default (docs/cluster.md)."""
        processes = len(self.homes.task_processes)
        if self.told_replaced or processes <= self.workers:
            return
        self.told_replaced = True
        say(f"forest: phase-2 tasks have run in {processes} worker processes for {self.workers} workers: Ray "
            "replaced worker processes (a lost worker, or idle ones killed between rounds: start the cluster's "
            "nodes with RAY_idle_worker_killing_time_threshold_ms=60000, docs/cluster.md)", file=sys.stderr)

    def _tree_budget(self, pool) -> int:
        """The most bytes any task's or actor's histogram may take (`forest.memory_budget_mb`);
        on several nodes also what a batch's partials in flight leave of the smallest object store."""
        offsets, thresholds = pool
        budget = int(self.cfg["memory_budget_mb"] * 2**20)
        self._homes()
        if self.homes.by_unit:  # a batch's partials, in flight between nodes, must fit the smallest object store
            stores = [v for k, v in object_store_bytes().items() if k in set(self.homes.nodes()) and v > 0]
            one_node = NUM_PARTS * len(offsets) * (thresholds.shape[1] + 1) * 4  # what validate allows for
            budget = max(min([budget] + [v // 4 for v in stores]), min(budget, one_node))
        return budget

    # ---- one round ------------------------------------------------------------------
    def _round(self, tree, frontier: list, depth: int, pool, selection: dict, state: dict, budget: int,
               tally: RoundTally) -> list:
        """Round `depth` of `tree`: phase 1 counts the `frontier` (sorted), then phases 2-4 run
        per node batch and split its nodes in `tree`. Returns the next frontier."""
        cfg, (offsets, thresholds) = self.cfg, pool
        phase1_start = time.perf_counter()
        degrees = self._degrees(depth, len(offsets))
        data_parts = self._data_partitions(int(degrees["data_units"]))
        n_tree_nodes = len(tree)  # phase 4 grows `tree` mid-round
        # the tree's split fields are broadcast to every task (2.1); its counts are not
        traversal_ref = ray.put(traversal_arrays(tree.arrays()))
        counts_of, weights = self._frontier_counts(tree, frontier, depth, traversal_ref, data_parts, selection,
                                                   state, tally)
        tally.phase1_s = time.perf_counter() - phase1_start
        active = [n for n in frontier if counts_of[n].sum() >= cfg["min_examples"]]
        # a small round is dominated by Ray's per-task cost: one task per worker, one
        # feature partition (the tree does not depend on partitioning)
        work = sum(int(counts_of[n].sum()) for n in active) * len(offsets)
        small = work < cfg.get("small_round_example_features", 0)
        if small:  # one task per worker over all features; the driver is the one reducer
            degrees = dict(degrees, data_units=min(int(degrees["data_units"]), self.workers), features=1, nodes=1)
            data_parts = self._data_partitions(int(degrees["data_units"]))
        # [2]+[3] per node batch: histograms in tasks, sums and best splits in actors
        columns = [int((counts_of[n] > 0).sum()) for n in active]
        itemsizes = [count_dtype(int(counts_of[n].max())).itemsize for n in active]
        batches = plan_batches(active, columns, len(offsets), -(-len(offsets) // degrees["features"]),
                               thresholds.shape[1] + 1, int(degrees["nodes"]), budget, itemsizes)
        tally.planned(int(sum(counts_of[n].sum() for n in active)), columns, itemsizes, thresholds.shape,
                      len(data_parts), int(degrees["features"]), batches, small,
                      self._phase3_threads(max((len(nb) - 1 for _, nb, _ in batches), default=1)), n_tree_nodes)
        last_parents = set(self.parents.held)  # the parents this round uses
        self.parents.reset_peak()
        # [4] phase 4 (interleaved per batch): split nodes, grow the next frontier
        next_frontier = []
        for b, (batch, node_bounds, itemsize) in enumerate(batches):
            def plan_and_count():
                plan = self._batch(traversal_ref, batch, node_bounds, itemsize, counts_of, pool, degrees,
                                   data_parts, selection, weights, depth, b, on_driver=small)
                return (plan, *(self._phases_2_3_on_driver(plan) if small else self._phases_2_3(plan)))

            try:
                plan, results, stats = plan_and_count()
            except ParentsLost:  # a parent's node is gone with its store: count this batch in full
                tally.parents_lost += 1
                self.parents.release(batch)
                plan, results, stats = plan_and_count()
            tally.add_batch(stats, sum(int(counts_of[n].sum()) for n, d in zip(batch, plan.derived) if d))
            start = time.perf_counter()
            for node, (f, t, gain, left, right) in zip(batch, _by_node(results)):
                if f < 0 or gain <= cfg["min_gain"]:
                    continue  # stays a leaf
                children = tree.split(node, f, offsets[f], thresholds[f, t], left, right)
                next_frontier += [c for c in children if depth + 1 < cfg["max_depth"]
                                  and tree.counts[c].sum() >= cfg["min_examples"]]
            if "phase4" in self.hooks:
                self.hooks["phase4"](self, depth, b)
            self.parents.release(batch)  # this batch's parents are used: room for its own
            self._keep_parents(plan, batch, results, tree, next_frontier, small)
            tally.phase4_s += time.perf_counter() - start
        self.parents.release(last_parents)
        return next_frontier

    def _frontier_counts(self, tree, frontier: list, depth: int, traversal_ref, data_parts: list,
                         selection: dict, state: dict, tally: RoundTally) -> tuple[dict, np.ndarray]:
        """[1] phase 1: each frontier node's class counts, and the tree's class weights.

        At the root phase 1 scans the data for the class priors (the normalisation constants);
        the weights follow from them. Below it the frontier's counts are the last split's
        left/right counts, so the scan is repeated only to verify them (forest.verify_counts)."""
        if depth == 0 or self.cfg.get("verify_counts"):
            counts, busy_s, counts_bytes = self._phase1(traversal_ref, frontier, data_parts, selection, depth)
        else:
            counts, busy_s, counts_bytes = np.array(tree.counts)[frontier], 0.0, 0
        tally.counted(busy_s, counts_bytes)
        if depth == 0:
            tree.counts[0] = counts[0]
            priors = counts[0] / max(counts[0].sum(), 1)
            present = priors > 0
            weights = np.where(present, 1.0 / (present.sum() * np.where(present, priors, 1.0)), 0.0)
            state["class_weights"].append(weights)
        elif not np.array_equal(counts, np.array(tree.counts)[frontier]):
            raise RuntimeError("re-association disagrees with the counts of the last split")
        return dict(zip(frontier, counts)), state["class_weights"][self.tree_index]

    def shutdown(self) -> None:
        self.reducers.shutdown()


def _by_node(results):
    """Flatten per-actor phase-3 results, in node (slot) order, to (f, t, gain, left, right)."""
    for r in results:
        for i in range(len(r["feature"])):
            yield int(r["feature"][i]), int(r["threshold"][i]), float(r["gain"][i]), r["left"][i], r["right"][i]


def tree_pool(seed: int, tree_index: int, forest_cfg: dict):
    """Tree `tree_index`'s candidate features: offsets (F, 4) pixel-metres, thresholds (F, T) mm."""
    rng = np.random.default_rng([seed, 3, tree_index])
    max_offset_pxm = forest_cfg["max_offset_m"] * focal_length_px(forest_cfg["image_width"])
    return candidate_pool(rng, forest_cfg["n_offsets"], forest_cfg["n_thresholds"], max_offset_pxm,
                          forest_cfg["threshold_range_mm"], forest_cfg["unary_fraction"])


@contextlib.contextmanager
def round_runner(cfg: dict, ctx, checkpoint, round_ends: list):
    """The run's RoundRunner and the list its rounds' metrics go to, made before the run's data
    so that the data step's last wave can start the histogram actors (``start_actors_early``);
    the actors are ended on the way out, whatever happened. Each round's metrics are logged at
    step tree x max_depth + depth and its end time appended to `round_ends`."""
    forest_cfg, strategy, seed = cfg["forest"], cfg["strategy"], cfg["seed"]
    total_rounds = forest_cfg["num_trees"] * forest_cfg["max_depth"]
    history: list[dict] = []

    def on_round(tree_index, depth, metrics):
        step = tree_index * forest_cfg["max_depth"] + depth
        history.append(metrics)
        round_ends.append(time.time())
        ctx.log_metrics(metrics, step=step)
        ctx.progress(step + 1, total_rounds, desc=f"tree {tree_index + 1}/{forest_cfg['num_trees']} depth {depth}",
                     **{"Mef/s": metrics["round/example_features_per_s"] / 1e6})

    runner = RoundRunner([], forest_cfg, strategy, seed, checkpoint, on_round)
    try:
        yield runner, history
    finally:
        runner.shutdown()


def grow_forest(runner: RoundRunner, train_refs: list, state: dict) -> None:
    """Grow the trees `state` (fresh or resumed, checkpoint.initial_state) still lacks from the
    data units `train_refs`, round by round, checkpointing every round (``round_runner``)."""
    forest_cfg, seed = runner.cfg, runner.seed
    runner.block_refs = train_refs

    def grow_all():
        for tree_index in range(len(state["trees"]), forest_cfg["num_trees"]):
            runner.train_tree(tree_index, tree_pool(seed, tree_index, forest_cfg), state)

    # off the main thread (orchard/background.py): the rounds submit thousands of tasks, and a
    # SIGTERM landing while the main thread submits one reaches orchard as a SIGINT; on an
    # interrupt `stopping` is set and the rounds cancel their tasks within a second or so
    background.call(grow_all, name="forest-rounds", stopping=runner.stopping)
