"""workloads/forest/locality.py: where a round's data-unit work runs."""
from __future__ import annotations

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from workloads.forest import locality


def test_work_without_a_home_keeps_rays_default_and_so_stays_in_a_trials_placement_group():
    """None, not the string "DEFAULT": Ray captures a task into its caller's placement group only
    when no strategy is given; an explicit "DEFAULT" took a sweep trial's tasks out of its group,
    where no CPU was free (the forest sweep hung)."""
    assert locality.on_node(None) is None
    placed = locality.on_node("ab" * 28)
    assert isinstance(placed, NodeAffinitySchedulingStrategy) and placed.soft


def test_homes_fill_each_node_to_its_cpu_share_first_with_the_units_it_holds(monkeypatch):
    units = [f"u{i}" for i in range(5)]
    held = {"u0": "b", "u1": "b", "u2": "b", "u3": "a", "u4": None}
    monkeypatch.setattr(locality, "locations",
                        lambda refs: {r: ({held[r]} if held[r] else set(), 10) for r in refs})
    home = locality.assign_homes(units, {"a": 1.0, "b": 1.0})
    # node b holds three but its share is 2 of 5 (a gets the remainder's one): u2 goes to a
    assert home == {"u0": "b", "u1": "b", "u3": "a", "u2": "a", "u4": "a"}
    assert locality.assign_homes(units, {}) == {}
    parts = locality.group_by_home(units, home, degree=2)
    assert sorted(node for node, _ in parts) == ["a", "b"]
    assert all(all(home[u] == node for u in refs) for node, refs in parts)


def test_unit_homes_count_what_tasks_read_off_home_and_each_task_process_once(monkeypatch):
    """UnitHomes on two nodes (the cluster's answers stubbed): a unit homed away from the node that
    holds it is counted once, in the next round; a task that ran off its units' home counts their
    bytes; a phase-2 process counts once however many tasks it ran; partitions keep to one home."""
    units = [f"u{i}" for i in range(4)]
    held = {"u0": "a", "u1": "a", "u2": "a", "u3": "b"}
    monkeypatch.setattr(locality, "cpu_nodes", lambda: {"a": 1.0, "b": 1.0})
    monkeypatch.setattr(locality, "locations", lambda refs: {r: ({held[r]}, 100) for r in refs if r in held})
    monkeypatch.setattr(locality, "object_store_bytes", lambda: {"a": 1000, "b": 1000})
    homes = locality.UnitHomes(in_group=False)
    assert homes.choose(units) and not homes.choose(units)  # once per run
    assert homes.by_unit == {"u0": "a", "u1": "a", "u3": "b", "u2": "b"} and homes.nodes() == ["a", "b"]
    assert all(len({homes.by_unit[u] for u in part}) == 1 for part in homes.partitions(units, 3))
    assert homes.slots(workers=4, cpus_per_worker=1.0) == {"a": 1, "b": 1}
    # budget by units (2 of 4), capped at the units' share of half their node's store (2 of 2 units)
    assert homes.cache_budget(["u0", "u1"], budget=400, n_units=4) == 200
    assert homes.cache_budget(["u0", "u1"], budget=4000, n_units=4) == 500
    homes.begin_round()  # u2's fetch to b: this round's
    homes.ran("a", ["u0", "u1"], pid=7)
    homes.ran("a", ["u0", "u1"], pid=7)
    homes.ran("a", ["u3"], pid=8)  # u3's home is b
    assert homes.round_figures() == {"round/unit_bytes_across_nodes": 200, "round/tasks_off_home": 1,
                                     "round/task_nodes": 1, "round/task_processes": 2}
    homes.begin_round()
    assert homes.round_figures()["round/unit_bytes_across_nodes"] == 0  # the fetch was counted once


def test_unit_homes_in_a_trials_placement_group_choose_none_and_place_nothing(monkeypatch):
    monkeypatch.setattr(locality, "cpu_nodes", lambda: {"a": 1.0, "b": 1.0})
    homes = locality.UnitHomes(in_group=True)
    assert homes.choose(["u0", "u1", "u2"]) and homes.by_unit == {} and homes.nodes() == []
    assert homes.place(["u0"]) is None and homes.home_of(["u0"]) is None
    assert homes.slots(workers=3, cpus_per_worker=1.0) == {None: 3}
    assert homes.partitions(["u0", "u1", "u2"], 2) == [["u0", "u1"], ["u2"]]
    assert homes.cache_budget(["u0"], budget=300, n_units=3) == 100
