"""Where a round's data-unit work runs: on the node that holds the unit (2.2's data partitions).

Each data unit (a block and, once the tree's encode task made it, its bin cache) gets a *home*
node, chosen once per run: the node that already holds the block, as long as that node's
share of the units (by its CPUs) is not full, else the next node with room, in node order. The
encode task of a unit runs on its home (so the unit's one fetch, if any, happens there, once, and
its bin cache is born there), and every phase-1 and phase-2 task over the unit runs there too
(`NodeAffinitySchedulingStrategy(soft=True)`: a node that went away falls back to Ray's choice).
Only the partial histograms (the split candidates' counts) then travel to the histogram actors.

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

