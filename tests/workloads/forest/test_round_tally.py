"""workloads/forest/round_tally.py: a round's figures, phase by phase, and the metrics it logs."""
from __future__ import annotations

import pytest

from workloads.forest.round_tally import RoundTally
from workloads.forest.subtraction import ParentStore


def batch(**figures) -> dict:
    """One node batch's phase 2-3 stats (RoundRunner._batch_stats' keys), zero but for `figures`."""
    stats = dict.fromkeys(("phase2_s", "phase3_s", "phase2_tasks", "phase2_sparse_tasks", "task_busy_s",
                           "actor_busy_s", "example_features", "shuffle_bytes", "dense_bytes",
                           "hist_peak_bytes"), 0)
    return {**stats, **figures}


def plan(tally: RoundTally, examples: int = 100, batches=(([1, 2], [0, 2], 1),), small: bool = False) -> None:
    tally.planned(examples, columns=[3, 2], itemsizes=[1, 2], pool_shape=(10, 4), data_partitions=2,
                  feature_partitions=1, batches=list(batches), small=small, phase3_threads=3, tree_nodes=3)


def test_a_rounds_batches_add_up_and_its_peak_is_the_largest_batchs():
    tally = RoundTally(tree=1, depth=2, cache={"bytes": 500, "blocks": 4, "busy_s": 9.0})
    tally.counted(busy_s=0.5, counts_bytes=40)
    plan(tally, batches=[([1], [0, 1], 1), ([2, 3], [0, 1, 2], 1)])
    tally.add_batch(batch(phase2_s=1.0, phase3_s=0.5, task_busy_s=2.0, actor_busy_s=1.0, shuffle_bytes=100,
                          example_features=1000, hist_peak_bytes=300), derived_examples=30)
    tally.add_batch(batch(phase2_s=1.0, phase3_s=0.5, task_busy_s=2.0, actor_busy_s=1.0, shuffle_bytes=100,
                          example_features=1000, hist_peak_bytes=200), derived_examples=10)
    tally.phase1_s = 0.25
    m = tally.metrics(ParentStore(2**20, True), {"round/task_nodes": 1})
    assert (m["round/tree"], m["round/depth"], m["round/node_batches"], m["round/node_partitions"]) == (1, 2, 2, 2)
    assert (m["round/phase2_s"], m["round/phase3_s"], m["round/hist_peak_bytes"]) == (2.0, 1.0, 300)
    # the frontier's counts travel in the shuffle too; the tasks' busy seconds include phase 1's
    assert (m["round/shuffle_bytes"], m["round/task_busy_s"], m["round/actor_busy_s"]) == (240, 4.5, 2.0)
    assert m["round/example_features_per_s"] == pytest.approx(1000)
    assert (m["round/examples_histogrammed"], m["round/subtraction_saved"]) == (60, 0.4)
    # phases 2-3's parallelism leaves phase 1's busy seconds out; phase 1's is its own
    assert m["round/phase23_parallelism"] == pytest.approx(2.0)
    assert m["round/phase1_parallelism"] == pytest.approx(2.0)
    # the tree's bin cache was built in an earlier round: its size is logged, not its seconds
    assert (m["round/bin_cache_s"], m["round/bin_cache_bytes"], m["round/bin_cache_blocks"]) == (0.0, 500, 4)
    assert m["round/hist_unbatched_bytes"] == (3 * 1 + 2 * 2) * 10 * 5
    assert m["round/task_nodes"] == 1 and m["round/total_s"] > 0


def test_the_round_that_builds_the_bin_cache_counts_its_busy_seconds_as_the_tasks_not_as_phases_2_3s():
    tally = RoundTally(tree=0, depth=0)
    tally.encoded({"bytes": 800, "blocks": 2, "busy_s": 3.0})
    plan(tally)
    tally.add_batch(batch(phase2_s=1.0, task_busy_s=1.0), derived_examples=0)
    m = tally.metrics(ParentStore(2**20, True), {})
    assert m["round/bin_cache_s"] > 0 and m["round/bin_cache_bytes"] == 800
    assert m["round/task_busy_s"] == 4.0
    assert m["round/phase23_parallelism"] == pytest.approx(1.0)


def test_a_round_the_driver_reduced_reports_no_actors():
    tally = RoundTally(tree=0, depth=5, cache={"bytes": 0, "blocks": 0, "busy_s": 0.0})
    plan(tally, small=True)
    m = tally.metrics(ParentStore(2**20, True), {})
    assert (m["round/node_partitions"], m["round/phase3_threads"], m["round/parents_lost"]) == (0, 0, 0)
