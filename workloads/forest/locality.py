"""Where a round's data-unit work runs: on the node that holds the unit (2.2's data partitions).

Each data unit (a block and, once the tree's encode task made it, its bin cache) gets a *home*
node, chosen once per run: the node that already holds the block, as long as that node's
share of the units (by its CPUs) is not full, else the next node with room, in node order. The
encode task of a unit runs on its home (so the unit's one fetch, if any, happens there, once, and
its bin cache is born there), and every phase-1 and phase-2 task over the unit runs there too
(`NodeAffinitySchedulingStrategy(soft=True)`: a node that went away falls back to Ray's choice).
Only the partial histograms (the split candidates' counts) then travel to the histogram actors.
A run's homes, and what its tasks read away from them each round, are one ``UnitHomes``.

Measured on a two-node ``ray.cluster_utils.Cluster`` (docs/scaling.md, forest): without homes
every feature partition's task read every unit, half of them from the other node's object store,
every round. The trees do not depend on where a task ran or how units are grouped (integer
counts), so homes change no tree.
"""
from __future__ import annotations

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def cpu_nodes() -> dict[str, float]:
    """Alive nodes with CPUs: node id (hex) -> CPUs, in node-id order."""
    nodes = {n["NodeID"]: float(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")}
    return {k: v for k, v in sorted(nodes.items()) if v > 0}


def object_store_bytes() -> dict[str, int]:
    """Alive nodes' object-store capacity in bytes, by node id."""
    return {n["NodeID"]: int(n["Resources"].get("object_store_memory", 0)) for n in ray.nodes() if n.get("Alive")}


def locations(refs: list) -> dict:
    """ref -> (node ids holding it, size in bytes); refs whose lookup failed are absent."""
    found = ray.experimental.get_object_locations(list(refs))
    return {ref: (set(loc.get("node_ids") or []), int(loc.get("object_size") or 0)) for ref, loc in found.items()}


def assign_homes(block_refs: list, nodes: dict[str, float]) -> dict:
    """block ref -> home node id: each node takes up to its CPU share of the units, first those it
    already holds, then (in unit order) those whose holder is full. Deterministic for the same
    locations; with one node every unit's home is that node."""
    if not nodes:
        return {}
    ids, cpus = list(nodes), np.array(list(nodes.values()))
    quota = np.floor(len(block_refs) * cpus / cpus.sum()).astype(int)
    quota[: len(block_refs) - quota.sum()] += 1  # the remainder, one each, in node order
    where = locations(block_refs)
    home, load = {}, dict.fromkeys(ids, 0)
    for ref in block_refs:
        held = [n for n in ids if n in where.get(ref, (set(), 0))[0] and load[n] < quota[ids.index(n)]]
        if held:
            home[ref] = held[0]
            load[held[0]] += 1
    for ref in block_refs:
        if ref not in home:
            n = next(n for n in ids if load[n] < quota[ids.index(n)])
            home[ref] = n
            load[n] += 1
    return home


def group_by_home(block_refs: list, home: dict, degree: int) -> list[tuple]:
    """`degree` data partitions (at least one per home node), each of units sharing a home:
    [(node id or None, [block refs])]; a node's partitions are in proportion to its units."""
    by_node: dict = {}
    for ref in block_refs:
        by_node.setdefault(home.get(ref), []).append(ref)
    total = len(block_refs)
    parts = []
    for node, refs in by_node.items():
        share = max(1, min(len(refs), int(round(degree * len(refs) / max(total, 1)))))
        parts += [(node, list(p)) for p in np.array_split(np.array(refs, dtype=object), share)]
    return parts


def on_node(node):
    """Scheduling strategy for work over units homed on `node`; None without a home: Ray's
    default, which keeps a task inside the caller's placement group (a sweep trial's). An explicit
    "DEFAULT" would take it out of the group: inside a trial that holds every CPU of the cluster,
    its tasks then waited for a CPU that never came free (the forest sweep hung)."""
    return None if node is None else NodeAffinitySchedulingStrategy(node_id=node, soft=True)



class UnitHomes:
    """A run's data units' homes and what its tasks read away from them.

    The homes are chosen once per run (`choose`), only with several nodes and outside a sweep
    trial's placement group (whose tasks stay in the group): elsewhere `by_unit` is empty and every
    task goes where Ray puts it. Per round it counts the bytes of units that tasks read from a node
    other than their own (the units' one fetch to their homes included), the tasks that ran off
    home and the nodes that ran any (`round_figures`); and, over the run, every process that ran a
    phase-2 task: more than the workers means Ray replaced idle ones between rounds, each new one
    paying its start and kernel loads again (orchard.cluster.IDLE_WORKER_KEEP_MS)."""

    def __init__(self, in_group: bool):
        self.in_group = in_group
        self.by_unit: dict | None = None  # block ref -> home node id; None until chosen, {} without homes
        self.block_bytes: dict = {}  # block ref -> its bytes in the object store
        self.unit_bytes: dict = {}  # block ref -> bytes of the block and its bin cache, this tree's
        self.fetch_bytes = 0  # the units' one fetch to their homes, not yet counted in a round
        self.across = {"bytes": 0, "tasks": 0, "nodes": set()}  # this round's reads off home
        self.task_processes: set = set()  # (node, pid) of every process that ran a phase-2 task

    def choose(self, block_refs: list) -> bool:
        """Choose each unit's home once per run; True on the call that chose them."""
        if self.by_unit is not None:
            return False
        nodes = cpu_nodes()
        self.by_unit = assign_homes(block_refs, nodes) if len(nodes) > 1 and not self.in_group else {}
        where = locations(block_refs) if self.by_unit else {}
        self.block_bytes = {ref: size for ref, (_, size) in where.items()}
        self.unit_bytes = dict(self.block_bytes)
        # a unit homed away from the node that holds it is fetched there once, by its encode
        # task: counted in the next round's unit_bytes_across_nodes
        self.fetch_bytes = sum(size for ref, (held, size) in where.items() if self.by_unit[ref] not in held)
        return True

    def nodes(self) -> list:
        """The home nodes, in order (empty without homes)."""
        return sorted(set((self.by_unit or {}).values()))

    def partitions(self, block_refs: list, degree: int) -> list[list]:
        """`degree` lists of block refs; with homes, each list's units share a home node and every
        node holding units gets at least one (group_by_home)."""
        degree = max(1, min(degree, len(block_refs)))
        if self.by_unit:
            return [refs for _, refs in group_by_home(block_refs, self.by_unit, degree)]
        return [list(p) for p in np.array_split(np.array(block_refs, dtype=object), degree)]

    def home_of(self, units: list):
        """The home node of a data partition's units (None without homes)."""
        return self.by_unit.get(units[0]) if self.by_unit and units else None

    def place(self, units: list):
        """Scheduling strategy of a task over `units` (one home): on their home node."""
        return on_node(self.home_of(units))  # None: Ray's default, which stays in a trial's group

    def slots(self, workers: int, cpus_per_worker: float) -> dict:
        """Tasks in flight at once, by home node: the workers a node's CPUs hold (at least one),
        or `workers` under None without homes."""
        if not self.by_unit:
            return {None: workers}
        return {node: max(1, int(cpus // cpus_per_worker)) for node, cpus in cpu_nodes().items()}

    def cache_budget(self, part: list, budget: int, n_units: int) -> int:
        """A partition's share of the bin cache's `budget` bytes (by its units, of `n_units`), no
        more than its share of half its home node's object store: a cache the store cannot hold
        beside the blocks would be spilled to disk and read back every round (ray.cluster_utils
        nodes have 150 MiB)."""
        share = budget * len(part) // n_units
        if not self.by_unit:
            return share
        node = self.by_unit.get(part[0])
        on_node_units = sum(1 for h in self.by_unit.values() if h == node)
        store = object_store_bytes().get(node, 0)
        return min(share, store // 2 * len(part) // max(on_node_units, 1)) if store else share

    def cached(self, bin_cache: dict) -> None:
        """The tree's bin cache is made (block ref -> its cache's ref): a unit's bytes are now its
        block's and its cache's, read by every task over it."""
        if self.by_unit:
            sizes = locations(list(bin_cache.values()))
            self.unit_bytes = {b: size + sizes.get(bin_cache.get(b), (None, 0))[1]
                               for b, size in self.block_bytes.items()}

    def begin_round(self) -> None:
        """A round starts its counts; the units' one fetch to their homes, if not yet counted, is
        this round's (their encode tasks make it)."""
        self.across = {"bytes": self.fetch_bytes, "tasks": 0, "nodes": set()}
        self.fetch_bytes = 0

    def ran(self, node: str, units: list, pid: int | None = None) -> None:
        """A task over `units` ran on `node`: count what it read from another node, and a phase-2
        task's process (`pid`)."""
        if pid is not None:
            self.task_processes.add((node, pid))
        self.across["nodes"].add(node)
        if self.by_unit and self.by_unit.get(units[0]) != node:
            self.across["bytes"] += sum(self.unit_bytes.get(u, 0) for u in units)
            self.across["tasks"] += 1

    def round_figures(self) -> dict:
        """This round's locality metrics, and the phase-2 processes so far (a count, not a sum)."""
        return {"round/unit_bytes_across_nodes": self.across["bytes"], "round/tasks_off_home": self.across["tasks"],
                "round/task_nodes": len(self.across["nodes"]), "round/task_processes": len(self.task_processes)}
