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
