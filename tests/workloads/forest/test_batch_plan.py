"""workloads/forest/batch_plan.py: node batches sized to the histograms' width, and a task for every worker."""
from __future__ import annotations

import numpy as np

from workloads.forest.histogram_kernels import best_splits


def test_histograms_are_as_narrow_as_their_largest_column_and_batches_widen_with_them():
    """Deep nodes hold a few hundred examples: their counts fit uint8/uint16, so a batch's
    histogram takes a quarter/half of the int32 bytes and the same budget holds more nodes;
    best_splits reads any of them to the same split."""
    from workloads.forest.batch_plan import plan_batches
    from workloads.forest.shuffle import count_dtype

    assert [count_dtype(n).name for n in (0, 255, 256, 65535, 65536)] == \
        ["uint8", "uint8", "uint16", "uint16", "int32"]
    nodes, columns = list(range(40)), [5] * 40
    budget = 20 * 5 * 10 * 8 * 4            # 20 nodes' int32 histograms (10 features, 8 bins)
    wide = plan_batches(nodes, columns, 10, 10, 8, 4, budget)
    narrow = plan_batches(nodes, columns, 10, 10, 8, 4, budget, [1] * 40)
    mixed = plan_batches(nodes, columns, 10, 10, 8, 4, budget, [1] * 20 + [4] * 20)
    assert [len(b[0]) for b in wide] == [20, 20] and {b[2] for b in wide} == {4}
    assert [len(b[0]) for b in narrow] == [40] and narrow[0][2] == 1
    assert all(len(b[0]) * 5 * 10 * 8 * b[2] <= budget for b in mixed) and mixed[-1][2] == 4

    rng = np.random.default_rng(3)
    hist = rng.integers(0, 200, (6, 4, 9)).astype(np.int32)
    col_start, col_class = np.array([0, 2, 6], np.int32), np.array([0, 3, 0, 1, 2, 5], np.int32)
    weights = rng.uniform(0.5, 2.0, 31)
    as_int32 = best_splits(hist, col_start, col_class, weights, 3, 31)
    for dtype in (np.uint8, np.uint16):
        for a, b in zip(as_int32, best_splits(hist.astype(dtype), col_start, col_class, weights, 3, 31)):
            np.testing.assert_array_equal(a, b)


def test_a_round_has_a_task_and_a_histogram_actor_for_every_worker():
    from workloads.forest.batch_plan import fill_workers

    degrees = {"data_units": 4, "features": 2, "nodes": 2}
    assert fill_workers(degrees, 2, 1000) is degrees                 # the 2-core defaults stand
    assert fill_workers(degrees, 8, 1000) == {"data_units": 4, "features": 2, "nodes": 8}  # tasks enough: actors raised
    assert fill_workers(degrees, 16, 1000) == {"data_units": 4, "features": 4, "nodes": 16}
    assert fill_workers({**degrees, "data_units": 2}, 16, 1000)["features"] == 8
    assert fill_workers({**degrees, "data_units": 3}, 16, 1000)["features"] == 6  # 18 tasks: none short
    assert fill_workers({**degrees, "data_units": 1}, 64, 16)["features"] == 16  # never below one offset a part
    assert fill_workers({**degrees, "nodes": 32}, 16, 1000)["nodes"] == 32       # more than workers stays
    # actors reserve CPUs: no more of them than workers the cluster runs at once (16 workers on 2
    # CPUs waited forever for the 9th actor); the tasks still fill every worker
    assert fill_workers(degrees, 16, 1000, running=2) == {"data_units": 4, "features": 4, "nodes": 2}
    # forest.actors_per_worker scales the actors' floor (rounded up), never the tasks'; 0 keeps `nodes`
    assert fill_workers(degrees, 16, 1000, actors_per_worker=0.25) == {"data_units": 4, "features": 4, "nodes": 4}
    assert fill_workers(degrees, 12, 1000, actors_per_worker=0.25)["nodes"] == 3
    assert fill_workers(degrees, 30, 1000, actors_per_worker=0.1)["nodes"] == 3  # not 4: 0.1 x 30 in floats
    assert fill_workers(degrees, 16, 1000, actors_per_worker=0.1)["nodes"] == 2  # partitions.nodes stays a floor
    assert fill_workers(degrees, 16, 1000, actors_per_worker=0)["nodes"] == 2


def test_actors_share_a_batch_evenly_and_keep_siblings_together():
    """Phase 3 lasts as long as its fullest actor: 64 frontier nodes (32 sibling pairs, ids 2i+1
    and 2i+2) of 20-31 columns over 16 actors. Filled up to an even share + one node, 9 actors
    held them, the fullest twice the even share; now all 16 do, each within a pair of it, and no
    pair is split between actors (the larger sibling is derived only beside the smaller)."""
    from workloads.forest.batch_plan import balanced_bounds, plan_batches

    rng = np.random.default_rng(0)
    nodes, columns = list(range(63, 127)), [int(c) for c in rng.integers(20, 32, 64)]
    ((batch, bounds, _),) = plan_batches(nodes, columns, 1000, 250, 51, 16, 512 * 2**20, [2] * 64)
    shares = [sum(columns[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    assert batch == nodes and len(shares) == 16 and max(shares) <= sum(columns) / 16 + 2 * 31
    assert all(nodes[b] % 2 == 1 for b in bounds[1:-1])          # every actor starts at a left child
    # a lone node (its sibling not in the frontier) is a unit of its own; 2 actors take 3 units
    assert balanced_bounds([3, 4, 6], [10, 10, 20], 2, 100) == [0, 2, 3]
    # a share over an actor's capacity: None, and plan_batches falls back to its fill
    assert balanced_bounds([1, 2, 3, 4], [30, 30, 30, 30], 2, 50) is None
