"""orchard/sweep/saved_state.py: a sweep's identity is its command, less where it runs and records."""
from __future__ import annotations

from orchard.run.lifecycle import prepare
from orchard.sweep.saved_state import identity_overrides, sweep_key


def test_sweep_identity_is_the_command_less_where_it_runs_and_records():
    base = ["workload=tiny", "sweep=tiny_grid", "tiny.steps=7"]
    cfg, _ = prepare(base)
    cfg["_overrides"] = base
    same = dict(cfg, _overrides=["tiny.steps=7", "tracking.uri=sqlite:///elsewhere.db", "output_dir=/tmp/x",
                                 "sweep=tiny_grid", "cluster.num_cpus=2", "workload=tiny", "progress=never"])
    other = dict(cfg, _overrides=[*base, "tiny.lr=0.2"])
    assert sweep_key(cfg) == sweep_key(same)
    assert sweep_key(cfg) != sweep_key(other)
    assert sweep_key(cfg).startswith("tiny-tiny_grid-")
    assert identity_overrides(["tracking=none", "+tiny.x=1", "cluster=remote"]) == ["+tiny.x=1"]
