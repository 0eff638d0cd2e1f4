"""The distributed rounds: partition-invariance, histogram subtraction, resume, actor failure,
memory budget."""
import os
import signal
import time

import numpy as np
import pytest
import ray

from tests.session_ray import all_cpus_free
from tests.workloads.forest.helpers import make_blocks, palette, tiny_forest_cfg
from workloads.forest.checkpoint import initial_state, load_checkpoint
from workloads.forest.train import RoundRunner, TrainingInterrupted, tree_pool

STRATEGY = {"num_workers": 2, "cpus_per_worker": 1, "max_failures": 3}


@pytest.fixture(scope="module")
def block_refs(ray_session, tmp_path_factory):
    from orchard.config import compose
    pal = palette(lambda *o: compose(list(o)))
    blocks = make_blocks(tmp_path_factory.mktemp("forest_units"), pal, n_images=8, per_block=2)
    return [ray.put(b) for b in blocks]


def train(refs, fcfg, ckpt, state=None, hooks=None, seed=0):
    """Train fcfg['num_trees'] trees in rounds; returns (state, per-round metrics)."""
    rounds = []
    runner = RoundRunner(refs, fcfg, STRATEGY, seed, ckpt, hooks=hooks,
                         on_round=lambda t, d, m: rounds.append(m))
    state = state if state is not None else initial_state(fcfg, seed)
    try:
        for t in range(len(state["trees"]), fcfg["num_trees"]):
            runner.train_tree(t, tree_pool(seed, t, fcfg), state)
    finally:
        runner.shutdown()
    return state, rounds


def assert_same_forest(a, b):
    assert len(a["trees"]) == len(b["trees"])
    for ta, tb in zip(a["trees"], b["trees"]):
        assert ta.keys() == tb.keys()
        for k in ta:
            np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)


@pytest.fixture(scope="module")
def reference(block_refs, tmp_path_factory, request):
    """One unpartitioned run every other test compares with."""
    from orchard.config import compose
    fcfg = tiny_forest_cfg(lambda *o: compose(list(o)))
    state, rounds = train(block_refs, fcfg, tmp_path_factory.mktemp("ref") / "ckpt.npz")
    return fcfg, state, rounds


def test_reference_tree_grows_and_reports_rounds(reference):
    fcfg, state, rounds = reference
    tree = state["trees"][0]
    assert len(tree["left"]) > 7 and tree["depth"].max() == fcfg["max_depth"]
    assert [m["round/depth"] for m in rounds] == list(range(fcfg["max_depth"]))
    assert all(m["round/example_features_per_s"] > 0 and m["round/effective_parallelism"] > 0 for m in rounds)
    # per phase: the root scans the data (phase 1 busy); every round counts histograms
    assert rounds[0]["round/phase1_parallelism"] > 0
    assert all(m["round/phase23_parallelism"] > 0 for m in rounds)
    # every internal node has two children whose counts add up to the parent's
    for n in np.nonzero(tree["left"] >= 0)[0]:
        np.testing.assert_array_equal(tree["counts"][tree["left"][n]] + tree["counts"][tree["right"][n]],
                                      tree["counts"][n])


@pytest.mark.slow
def test_tree_is_identical_with_1_and_4_partitions(reference, block_refs, tmp_path):
    fcfg, ref_state, _ = reference
    four = dict(fcfg, partitions={"data_units": 4, "features": 4, "nodes": 4}, small_round_example_features=0,
                partitions_by_depth=[{"from_depth": 2, "data_units": 3, "features": 2, "nodes": 3}])
    actors_at = []  # (depth, histogram actors started) when a round's first partials arrive
    hooks = {"phase2": lambda runner, depth, batch: actors_at.append((depth, len(runner.actors)))}
    state, rounds = train(block_refs, four, tmp_path / "ckpt.npz", hooks=hooks)
    assert_same_forest(state, ref_state)
    assert any(m["round/subtraction_saved"] > 0 for m in rounds)   # derived in the actors too
    # every actor any round of the tree asks for is started with the tree, not by the round that
    # first needs it (a new actor's process start stalled that round)
    assert actors_at[0] == (0, 4) and {n for _, n in actors_at} == {4}


def test_more_workers_than_cpus_get_an_actor_per_running_worker_and_the_same_tree(reference, block_refs, tmp_path):
    """fill_workers gives phase 3 a histogram actor per worker the cluster runs at once: here 2 of
    the 16 workers (the session's 2 CPUs). Sized by the workers alone, the 9th actor waited for a
    CPU that never came free and the round hung; 8 CPUs' worth of workers on 2 CPUs ran 8 actors."""
    fcfg, ref_state, _ = reference
    wide = dict(fcfg, small_round_example_features=0)
    rounds = []
    runner = RoundRunner(block_refs, wide, dict(STRATEGY, num_workers=16), 0, tmp_path / "ckpt.npz",
                         on_round=lambda t, d, m: rounds.append(m))
    try:
        assert runner.running == 2 and runner._degrees(0, wide["n_offsets"])["nodes"] == 2
        state = initial_state(wide, 0)
        runner.train_tree(0, tree_pool(0, 0, wide), state)
        assert len(runner.actors) == 2
    finally:
        runner.shutdown()
    assert_same_forest(state, ref_state)
    # the root's one node fills one actor; below it the frontier's nodes fill both
    assert rounds[0]["round/node_partitions"] == 1 and max(m["round/node_partitions"] for m in rounds) == 2
    assert all(m["round/feature_partitions"] == 16 for m in rounds)  # 16 tasks: one per worker (16 offsets)


def test_fewer_actors_than_workers_when_asked_grow_the_same_tree(reference, block_refs, tmp_path):
    """forest.actors_per_worker=0 leaves partitions.nodes as set: one actor sums and searches
    every node for two workers (no floor of one per worker), its split search on both workers'
    cores, and the tree is the reference's."""
    fcfg, ref_state, _ = reference
    one = dict(fcfg, partitions=dict(fcfg["partitions"], nodes=1), partitions_by_depth=[],
               actors_per_worker=0.0, small_round_example_features=0)
    state, rounds = train(block_refs, one, tmp_path / "ckpt.npz")
    assert_same_forest(state, ref_state)
    assert {m["round/node_partitions"] for m in rounds} == {1}
    assert {m["round/phase3_threads"] for m in rounds} == {2}  # the one actor searches on both workers' cores


def test_node_partitions_whose_actors_leave_no_cpu_are_refused_naming_the_key(reference, block_refs, tmp_path):
    """16 actors x 0.25 CPU on the session's 2 CPUs: Ray never places the 9th, and the first round
    waited for it for ever; now the tree refuses to start, in one line naming the key."""
    from orchard.api import ConfigError

    fcfg, _, _ = reference
    crowded = dict(fcfg, partitions=dict(fcfg["partitions"], nodes=16), small_round_example_features=0)
    runner = RoundRunner(block_refs, crowded, STRATEGY, 0, tmp_path / "ckpt.npz")
    try:
        with pytest.raises(ConfigError, match=r"forest.partitions.nodes: .*16 actors x forest.actor_cpus 0.25"):
            runner.train_tree(0, tree_pool(0, 0, crowded), initial_state(crowded, 0))
        assert runner.actors == []  # refused before any actor started
    finally:
        runner.shutdown()


def test_a_data_step_that_fails_after_the_actors_started_early_ends_them(compose, tmp_path):
    """The actors start in the data step's last wave, before its units are read: a data step that
    fails (or is interrupted) past that point leaves no actor holding its CPU share, which in a
    notebook, a sweep's driver or this test session would starve the next run."""
    from workloads.forest.train import round_runner

    cfg = compose("workload=forest", "debug=smoke")
    cfg = dict(cfg, forest=tiny_forest_cfg(compose, partitions={"data_units": 1, "features": 1, "nodes": 2},
                                           small_round_example_features=0),
               strategy=dict(cfg["strategy"], **STRATEGY))
    with pytest.raises(RuntimeError, match="a bad pair"):
        with round_runner(cfg, None, tmp_path / "ckpt.npz", []) as (runner, _):
            assert runner.start_actors_early(0) == 2 and ray.get([a.ping.remote() for a in runner.actors])
            raise RuntimeError("a bad pair, read after the last wave began")
    assert runner.actors == [] and all_cpus_free(), ray.available_resources()


def test_the_console_is_told_once_when_ray_replaced_the_tasks_processes(compose, block_refs, tmp_path, capsys):
    """More processes than workers ran phase-2 tasks: Ray replaced some (a lost worker, or idle ones
    killed between rounds on a cluster started with Ray's default); the run says so once, on the
    driver's console, with the setting that keeps them."""
    runner = RoundRunner(block_refs, tiny_forest_cfg(compose), STRATEGY, 0, tmp_path / "ckpt.npz")
    try:
        runner.homes.task_processes = {("node", 11), ("node", 12)}  # as many as the 2 workers
        runner._tell_replaced_processes()
        assert capsys.readouterr().err == ""
        runner.homes.task_processes.add(("node", 13))
        runner._tell_replaced_processes()
        runner._tell_replaced_processes()  # a later round: already told
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "3 worker processes for 2 workers" in err, err
        assert "RAY_idle_worker_killing_time_threshold_ms=60000" in err
    finally:
        runner.shutdown()


def test_histogram_subtraction_grows_the_same_tree_with_less_counting(reference, block_refs, tmp_path):
    """The reference derives each split's larger child (parent - smaller child, on the driver in
    its small rounds); without subtraction every example is counted: the same tree either way."""
    fcfg, ref_state, ref_rounds = reference
    state, rounds = train(block_refs, dict(fcfg, histogram_subtraction=False), tmp_path / "ckpt.npz")
    assert_same_forest(state, ref_state)
    assert all(m["round/examples_histogrammed"] == m["round/examples"] and m["round/subtraction_saved"] == 0
               for m in rounds)
    assert ref_rounds[0]["round/subtraction_saved"] == 0                # the root has no parent
    for m in ref_rounds[1:]:                                           # below it about half is derived
        assert 0.4 < m["round/subtraction_saved"] < 1, (m["round/depth"], m["round/subtraction_saved"])
        assert m["round/examples_histogrammed"] < 0.6 * m["round/examples"]
        assert 0 < m["round/parent_hist_bytes"] <= fcfg["memory_budget_mb"] * 2**20


@pytest.mark.slow
def test_bin_cache_whole_partial_or_off_grows_the_same_tree(reference, block_refs, tmp_path):
    """The reference counts every block's cached bins; a budget that holds only some blocks'
    bins (the rest evaluated on the fly each round) and none at all (the paper's on-the-fly
    features) grow the identical tree, with the actors' rounds and the driver's."""
    from workloads.forest.data_unit import tree_selection

    fcfg, ref_state, ref_rounds = reference
    assert ref_rounds[0]["round/bin_cache_blocks"] == len(block_refs) and ref_rounds[0]["round/bin_cache_s"] > 0
    assert all(m["round/bin_cache_s"] == 0 for m in ref_rounds[1:])   # once per tree
    selection = {"seed": 0, "tree_index": 0, "image_fraction": fcfg["image_fraction"],
                 "pixel_fraction": fcfg["pixel_fraction"]}
    sizes = [int(tree_selection(ray.get(r), **selection).sum()) * fcfg["n_offsets"] for r in block_refs]
    # 2 workers: two encode tasks of 2 blocks each, each with half the budget; a half that holds
    # the largest block but not two caches each task's first block only
    assert len(block_refs) == 4 and STRATEGY["num_workers"] == 2
    for budget, cached, held in ((2 * max(sizes), 2, sizes[0] + sizes[2]), (0, 0, 0)):
        for small in (0, fcfg["small_round_example_features"]):
            state, rounds = train(block_refs, dict(fcfg, bin_cache_mb=budget / 2**20, small_round_example_features=small),
                                  tmp_path / f"{budget}-{small}.npz")
            assert_same_forest(state, ref_state)
            assert rounds[0]["round/bin_cache_blocks"] == cached and rounds[0]["round/bin_cache_bytes"] == held


def test_resume_after_interruption_equals_uninterrupted_run(compose, block_refs, tmp_path):
    fcfg = tiny_forest_cfg(compose, num_trees=2, max_depth=3)
    full, _ = train(block_refs, fcfg, tmp_path / "full.npz")
    ckpt = tmp_path / "interrupted.npz"
    with pytest.raises(TrainingInterrupted):           # dies in tree 2, after its first round
        train(block_refs, dict(fcfg, stop_after_rounds=4), ckpt)
    saved = load_checkpoint(ckpt)
    assert len(saved["trees"]) == 1 and saved["next_depth"] == 1 and saved["partial"] is not None
    resumed, rounds = train(block_refs, dict(fcfg, resume=str(ckpt)), tmp_path / "resumed.npz",
                            state=initial_state(dict(fcfg, resume=str(ckpt)), 0))
    assert [(m["round/tree"], m["round/depth"]) for m in rounds] == [(1, 1), (1, 2)]
    # parents are not checkpointed: the first resumed round counts everything, the next derives
    assert rounds[0]["round/subtraction_saved"] == 0 and rounds[1]["round/subtraction_saved"] > 0
    assert_same_forest(resumed, full)


def test_resume_refuses_a_checkpoint_of_another_config(compose, tmp_path, block_refs):
    fcfg = tiny_forest_cfg(compose, max_depth=1)
    train(block_refs, fcfg, tmp_path / "c.npz")
    with pytest.raises(ValueError, match="different forest config"):
        initial_state(dict(fcfg, n_thresholds=7, resume=str(tmp_path / "c.npz")), 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(actor) -> int:
    """SIGKILL an actor's process and wait until it is gone; returns its pid."""
    pid = ray.get(actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 60
    while time.time() < deadline and _alive(pid):
        time.sleep(0.05)
    return pid


# One small forest, seven failures: a histogram actor SIGKILLed in each phase of a round
# (phase 1: while the data is scanned; 2: after the first partials reached it; 3: while the
# actors answer, after actor 0 did, the other asked and maybe answered; "best": an actor dies
# inside its phase-3 call, its partials summed, before it answers; 4: while the driver splits),
# and a phase-2 task's or a bin-cache task's worker process killed mid-task. Each must give the
# uninterrupted run's tree.
@pytest.mark.slow
@pytest.mark.parametrize("phase", ["phase1", "phase2", "phase3", "best", "phase4", "task", "encode"])
def test_a_failure_at_any_phase_does_not_change_the_tree(phase, reference, block_refs, tmp_path):
    fcfg, ref_state, _ = reference
    killed = []

    def kill_actor(runner, depth, batch_index):
        if depth >= 1 and not killed:
            victim = 1 if phase == "phase3" else 0   # phase 3: the actor not yet collected
            killed.append((_kill(runner.actors[victim]), runner))

    # verify_counts: phase 1 runs in every round (by default only at the root); no small rounds:
    # every round goes through the actors (the reference reduced its small rounds on the driver)
    two_actors = dict(fcfg, partitions={"data_units": 2, "features": 1, "nodes": 2}, verify_counts=True,
                      small_round_example_features=0)
    marker = tmp_path / "task_killed"
    runners = []
    hooks = {"task_fault": str(marker)} if phase == "task" else \
        {"encode_fault": str(marker)} if phase == "encode" else \
        {"best_fault": str(marker), "phase4": lambda runner, *_: runners.append(runner)} if phase == "best" else \
        {phase: kill_actor}
    state, rounds = train(block_refs, two_actors, tmp_path / "ckpt.npz", hooks=hooks)
    if phase in ("task", "encode"):
        assert marker.exists()                         # a worker died mid-task and Ray re-ran it
        assert rounds[0]["round/bin_cache_blocks"] == len(block_refs)
    elif phase == "best":
        assert marker.exists() and runners[0].actor_replays >= 1   # died answering: its share recomputed
    else:
        (pid, runner), = killed
        assert not _alive(pid)
        if phase == "phase2":                         # its summed partials were lost: recomputed
            assert runner.actor_replays >= 1          # (phase 3: only if it had not answered yet)
        if phase in ("phase1", "phase2"):  # killed at depth >= 1 before deriving: the parents it held
            # (taken at the last round's end) went with its memory, and the batch was counted in full
            assert sum(m["round/parents_lost"] for m in rounds) >= 1, [m["round/parents_lost"] for m in rounds]
    assert_same_forest(state, ref_state)
    assert all(m["round/shuffle_bytes"] > 0 for m in rounds)
    # and nothing is left holding CPUs: an actor Ray restarted behind its kill once held its
    # share for the rest of the session, and a later run's workers never started
    assert all_cpus_free(), ray.available_resources()


@pytest.mark.slow
def test_memory_budget_holds_where_unbatched_histograms_would_not_fit(reference, block_refs, tmp_path):
    fcfg, ref_state, ref_rounds = reference
    # the least that can work: the root's histogram (no node has more columns or examples; its
    # counts are the widest) -- below validate's floor of one int32 node with all 31 classes,
    # since deep nodes' counts fit uint8 (shuffle.count_dtype) and would not need batching
    budget_mb = 1.01 * ref_rounds[0]["round/hist_unbatched_bytes"] / 2**20
    small = dict(fcfg, memory_budget_mb=budget_mb, partitions={"data_units": 2, "features": 1, "nodes": 2})
    state, rounds = train(block_refs, small, tmp_path / "ckpt.npz")
    deep = rounds[-1]
    assert deep["round/hist_unbatched_bytes"] > 2 * budget_mb * 2**20   # would not fit ...
    assert deep["round/node_batches"] > 1                              # ... so it was batched
    assert all(m["round/hist_peak_bytes"] <= budget_mb * 2**20 for m in rounds)
    # the parents kept for subtraction keep to the budget too (the rest counted in full)
    assert all(m["round/parent_hist_bytes"] <= budget_mb * 2**20 for m in rounds)
    assert max(m["round/hist_peak_bytes"] for m in ref_rounds) > budget_mb * 2**20
    assert_same_forest(state, ref_state)


def test_shuffle_bytes_are_sparse_and_within_the_docs_model(reference):
    """docs/forest.md models the shuffle at the paper's scale with shuffle.model_round_bytes:
    here the same model, fed each round's measured shape (the examples phase 2 counted: with
    histogram subtraction, not the derived ones), bounds the measured counter."""
    from workloads.forest.shuffle import model_round_bytes

    fcfg, _, rounds = reference
    for m in rounds:
        model = model_round_bytes(m["round/examples_histogrammed"], m["round/frontier_size"],
                                  m["round/hist_columns"] / m["round/frontier_size"], fcfg["n_offsets"],
                                  fcfg["n_thresholds"] + 1, int(m["round/data_partitions"]),
                                  int(m["round/feature_partitions"]))
        assert m["round/shuffle_bytes"] <= model["total"] * 1.05, (m["round/depth"], m["round/shuffle_bytes"], model)
        assert m["round/shuffle_bytes"] >= model["total"] / 4, (m["round/depth"], m["round/shuffle_bytes"], model)
    deep = rounds[-1]
    assert deep["round/shuffle_bytes"] < deep["round/shuffle_dense_bytes"] / 3   # sparse at depth


def test_a_checkpoint_the_disk_refuses_names_the_file_and_keeps_the_last_round(tmp_path, monkeypatch):
    """Written through write_atomic: a full disk is one line naming the checkpoint, the previous
    round's file stays whole and no partial file is left (before: a 0-byte .tmp.npz, no name)."""
    import errno

    from orchard import storage
    from workloads.forest.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "forest_checkpoint.npz"
    state = {"fingerprint": "f", "trees": [], "class_weights": [], "partial": None, "frontier": [1, 2], "next_depth": 3}
    save_checkpoint(path, state)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.atomic.os, "fsync", full)
    with pytest.raises(storage.StorageFull, match=f"no space left to write {path}"):
        save_checkpoint(path, {**state, "next_depth": 4})
    assert load_checkpoint(path)["next_depth"] == 3 and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# A two-node ray.cluster_utils.Cluster in its own process (the session's Ray is one node): the
# blocks are put by its driver, so all start on the head node; half are homed on the other node.
TWO_NODE_SCRIPT = """
import json, sys
import numpy as np
import ray
from ray.cluster_utils import Cluster
sys.path.insert(0, sys.argv[1])
from orchard.config import compose
from tests.session_ray import all_cpus_free
from tests.workloads.forest.helpers import make_blocks, palette, tiny_forest_cfg
from workloads.forest.checkpoint import initial_state
from workloads.forest.train import RoundRunner, tree_pool

cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
cluster.add_node(num_cpus=1)
cluster.wait_for_nodes()
ray.init(address=cluster.address, logging_level="ERROR")
try:
    c = lambda *o: compose(list(o))
    blocks = make_blocks(__import__("pathlib").Path(sys.argv[2]), palette(c), n_images=8, per_block=2)
    refs = [ray.put(b) for b in blocks]
    fcfg = tiny_forest_cfg(c, small_round_example_features=0,
                           partitions={"data_units": 1, "features": 2, "nodes": 2})
    rounds, state = [], initial_state(fcfg, 0)
    runner = RoundRunner(refs, fcfg, {"num_workers": 2, "cpus_per_worker": 1, "max_failures": 3}, 0,
                         sys.argv[2] + "/ckpt.npz", on_round=lambda t, d, m: rounds.append(m))
    early = runner.start_actors_early(0)  # 0: on two nodes the actors follow the units' homes
    runner.train_tree(0, tree_pool(0, 0, fcfg), state)
    runner.shutdown()
    np.savez(sys.argv[2] + "/tree.npz", **state["trees"][0])
    print("ROUNDS " + json.dumps({"rounds": rounds, "blocks": sum(b["depths"].nbytes for b in blocks),
                                  "homes": runner.homes.nodes(), "early": early}))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.slow
def test_two_nodes_count_where_the_data_units_live_and_grow_the_same_tree(reference, tmp_path):
    """Data-unit work runs on the node that holds the unit (locality.py): each unit crosses to its
    home once, in the first round, and no phase-1/2 task reads a unit from the other node after;
    both nodes count; the tree is the one-node tree. (Before: every task read every unit, half of
    them from the other node's object store, every round: 6.25x slower on two nodes.)"""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", TWO_NODE_SCRIPT, str(repo), str(tmp_path)], cwd=repo,
                          capture_output=True, text=True, timeout=180)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROUNDS ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("ROUNDS "):])
    rounds = out["rounds"]
    assert len(out["homes"]) == 2                                  # units homed on both nodes
    assert out["early"] == 0        # no actor started before the units had homes to place it by
    assert all(m["round/task_nodes"] == 2 for m in rounds)         # both nodes counted every round
    assert all(m["round/tasks_off_home"] == 0 for m in rounds)     # every task ran where its units live
    first, later = rounds[0]["round/unit_bytes_across_nodes"], [m["round/unit_bytes_across_nodes"] for m in rounds[1:]]
    assert 0 < first < out["blocks"]          # half the units crossed to their home, once
    assert later == [0] * len(later)          # ... and never again
    # below the root, larger children are derived from parents the actors kept on their own nodes;
    # only those needed on the other node crossed, never more than were held
    assert all(m["round/subtraction_saved"] > 0 for m in rounds[1:-1])
    assert sum(m["round/parent_wire_bytes"] for m in rounds) <= sum(m["round/parent_hist_bytes"] for m in rounds)
    with np.load(tmp_path / "tree.npz") as tree:
        assert_same_forest({"trees": [dict(tree)]}, reference[1])
