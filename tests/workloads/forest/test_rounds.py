"""The distributed rounds: partition-invariance, resume, actor failure, memory budget."""
import os
import time

import numpy as np
import pytest
import ray

from tests.workloads.forest.helpers import make_blocks, palette, tiny_forest_cfg
from workloads.forest.rounds import RoundRunner, TrainingInterrupted
from workloads.forest.train import initial_state, tree_pool
from workloads.forest.tree import load_checkpoint

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
    # every internal node has two children whose counts add up to the parent's
    for n in np.nonzero(tree["left"] >= 0)[0]:
        np.testing.assert_array_equal(tree["counts"][tree["left"][n]] + tree["counts"][tree["right"][n]],
                                      tree["counts"][n])


def test_tree_is_identical_with_1_and_4_partitions(reference, block_refs, tmp_path):
    fcfg, ref_state, _ = reference
    four = dict(fcfg, partitions={"data_units": 4, "features": 4, "nodes": 4},
                partitions_by_depth=[{"from_depth": 2, "data_units": 3, "features": 2, "nodes": 3}])
    state, rounds = train(block_refs, four, tmp_path / "ckpt.npz")
    assert_same_forest(state, ref_state)


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


def test_killed_histogram_actor_does_not_change_the_tree(reference, block_refs, tmp_path):
    fcfg, ref_state, _ = reference
    killed = []

    def kill_actor(runner, depth, batch_index):
        if depth == 2 and not killed:                 # partial histograms already sent to it
            actor = runner.actors[0]
            pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
            ray.kill(actor, no_restart=False)
            # ray.kill returns before the process dies: wait, so phase 3 of THIS batch meets
            # the failure (otherwise a late death only shows at the next batch's reset).
            deadline = time.time() + 60
            while time.time() < deadline and _alive(pid):
                time.sleep(0.05)
            killed.append(runner)

    nodes2 = dict(fcfg, partitions={"data_units": 2, "features": 1, "nodes": 2})
    state, _ = train(block_refs, nodes2, tmp_path / "ckpt.npz", hooks={"after_phase2": kill_actor})
    assert len(killed) == 1 and killed[0].actor_replays >= 1   # the failure was seen and repaired
    assert_same_forest(state, ref_state)


def test_memory_budget_holds_where_unbatched_histograms_would_not_fit(reference, block_refs, tmp_path):
    fcfg, ref_state, ref_rounds = reference
    one_node = fcfg["n_offsets"] * (fcfg["n_thresholds"] + 1) * 31 * 4
    budget_mb = 1.01 * one_node / 2**20                # the least validate allows: one full node
    small = dict(fcfg, memory_budget_mb=budget_mb, partitions={"data_units": 2, "features": 1, "nodes": 2})
    state, rounds = train(block_refs, small, tmp_path / "ckpt.npz")
    deep = rounds[-1]
    assert deep["round/hist_unbatched_bytes"] > 2 * budget_mb * 2**20   # would not fit ...
    assert deep["round/node_batches"] > 1                              # ... so it was batched
    assert all(m["round/hist_peak_bytes"] <= budget_mb * 2**20 for m in rounds)
    assert max(m["round/hist_peak_bytes"] for m in ref_rounds) > budget_mb * 2**20
    assert_same_forest(state, ref_state)
