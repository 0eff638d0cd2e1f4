"""workloads/forest/histogram_pool.py: a batch's resets are sent, not waited for, and the slices the tasks send follow them."""
from __future__ import annotations

import numpy as np


def _partial(hist):
    return {"shape": np.asarray(hist.shape, np.int64), "dense": hist}


def test_slices_sent_behind_an_unwaited_reset_are_summed_into_it_and_a_missing_parent_is_told(ray_session):
    """The driver sends a batch's resets and its phase-2 slices without waiting in between
    (train.py, ``_phases_2_3``): each actor runs one caller's calls in the order they were sent, so
    a slice lands in the histogram its reset started from the parent, never in the last batch's
    nor dropped as "no batch". A reset whose parent is gone is told by `confirm` after the slices
    (the batch is then counted in full), a reset that raised is raised, and an actor that died is
    left to the acknowledgements."""
    import pytest
    import ray

    from workloads.forest.histogram_pool import HistogramPool

    pool = HistogramPool(actor_cpus=0.0, in_group=False, max_failures=0)
    pool.ensure(2)
    a, b = pool.actors
    rng = np.random.default_rng(0)
    parent = rng.integers(0, 50, (2, 3, 4)).astype(np.uint16)
    # batch 1 (round 1): actor a sums `parent` and keeps it as parent (0, 7), as phase 4 asks
    ray.get(a.reset.remote(2, 3, 4, "uint16", None, 1))
    ray.get(a.add.remote(0, 0, _partial(parent)))
    ray.get(a.best.remote(np.array([0, 2]), np.array([0, 1], np.int32), np.ones(2), 1, keep=True))
    a.take.remote(np.array([0, 1]), [2], [(0, 7)], 1)  # not waited for, as the driver does not
    # batch 2 (round 2): a derives from its parent, b counts from zero; the slices follow at once
    slice_ = rng.integers(0, 50, (2, 3, 4)).astype(np.uint16)
    resets = pool.send_resets([(2, 3, 4, "uint16", [(0, ("held", (0, 7)))], 2),
                               (2, 3, 4, "uint16", None, 2)])
    acks = [x.add.remote(0, 0, _partial(slice_)) for x in (a, b)]
    assert ray.get(acks) == [1, 1]  # summed, after the resets
    assert pool.confirm(resets) is True
    ray.get(a.best.remote(np.array([0, 2]), np.array([0, 1], np.int32), np.ones(2), 1, keep=True))
    a.take.remote(np.arange(2), [2], [(9, 9)], 2)
    [summed] = ray.get(a.give.remote([(9, 9)]))
    np.testing.assert_array_equal(summed["dense"], parent + slice_)
    # batch 3: the parent was used, so it is held no more: the reset cannot have it, the slice
    # sent behind it finds no batch, and `confirm` says so
    resets = pool.send_resets([(2, 3, 4, "uint16", [(0, ("held", (0, 7)))], 3)])
    assert ray.get(a.add.remote(0, 0, _partial(slice_))) == -1
    assert pool.confirm(resets) is False
    # a reset that raised (here a parent of the wrong shape) is raised, not summed past
    bad = [(0, {"shape": np.array([2, 5, 4]), "dense": np.ones((2, 5, 4), np.uint16)})]
    with pytest.raises(ray.exceptions.RayTaskError):
        pool.confirm(pool.send_resets([(2, 3, 4, "uint16", bad, 4)]))
    # an actor that died: its reset fails, which `confirm` leaves to the acknowledgements
    ray.kill(b)
    resets = pool.send_resets([(2, 3, 4, "uint16", None, 4), (2, 3, 4, "uint16", None, 4)])
    assert pool.confirm(resets) is True
    assert pool.acked([b.add.remote(0, 0, _partial(slice_))]) is False
    pool.shutdown()


def test_phase_3_searches_on_the_threads_it_is_given_and_sums_on_one_after(ray_session):
    """Fewer actors than the workers' cores search their nodes on several threads each (phase 3
    runs while no task does); the answer is the one thread's, and the actor goes back to one
    thread for the next batch's sums, which run beside the phase-2 tasks."""
    import numba
    import ray

    from workloads.forest.histogram_pool import HistogramPool

    pool = HistogramPool(actor_cpus=0.0, in_group=False, max_failures=0)
    pool.ensure(1)
    [a] = pool.actors
    rng = np.random.default_rng(1)
    hist = rng.integers(0, 40, (8, 5, 6)).astype(np.int32)  # 4 nodes of 2 columns each
    col_start, col_class = np.array([0, 2, 4, 6, 8]), np.tile(np.array([0, 1], np.int32), 4)
    answers = []
    for threads in (1, 2):
        ray.get(a.reset.remote(8, 5, 6, "int32", None, 1))
        ray.get(a.add.remote(0, 0, _partial(hist)))
        answers.append(ray.get(a.best.remote(col_start, col_class, np.ones(2), 1, threads=threads)))
        assert ray.get(a.__ray_call__.remote(lambda actor: numba.get_num_threads())) == 1
    for key in ("feature", "threshold", "gain", "left", "right"):
        np.testing.assert_array_equal(answers[0][key], answers[1][key])
    assert (answers[0]["feature"] >= 0).any()  # splits were found, not only "none"
    pool.shutdown()


def test_a_slice_a_task_sends_is_summed_after_the_reset_the_driver_had_not_sent_yet(ray_session, tmp_path):
    """Phase-2 tasks send their slices themselves (round_tasks.send_slices), and a task is not the
    reset's caller: each slice carries its actor's reset, so Ray runs the add only once the reset has
    run. Here the reset waits on its parent (a ref not ready until a gate opens, as a driver's reset
    waits on its arguments) while the task's slice is already sent; without the reset before it, the
    slice would land in the last batch (its part id counted there, so dropped as a replay)."""
    import time

    import ray

    from workloads.forest.histogram_pool import HistogramPool
    from workloads.forest.round_tasks import send_slices

    @ray.remote(num_cpus=0)
    def parent_when_open(parent):
        while not (tmp_path / "go").exists():
            time.sleep(0.02)
        return [(0, _partial(parent))]

    @ray.remote(num_cpus=0)
    def task(actors, resets, partial):
        return send_slices(actors, resets, 0, 0, [partial])

    pool = HistogramPool(actor_cpus=0.0, in_group=False, max_failures=0)
    pool.ensure(1)
    [a] = pool.actors
    rng = np.random.default_rng(2)
    last, parent, slice_ = (rng.integers(0, 50, (2, 3, 4)).astype(np.uint16) for _ in range(3))
    ray.get(a.reset.remote(2, 3, 4, "uint16", None, 1))
    assert ray.get(a.add.remote(0, 0, _partial(last))) == 1   # the last batch: task 0's slice summed
    reset = a.reset.remote(2, 3, 4, "uint16", parent_when_open.remote(parent), 2)   # held by its argument
    [ack] = ray.get(task.remote([a], [reset], _partial(slice_)))
    assert ray.wait([ack], timeout=1.0)[0] == []   # the slice waits for the reset
    (tmp_path / "go").touch()
    assert ray.get(ack) == 1 and ray.get(reset) is True
    best = ray.get(a.best.remote(np.array([0, 2]), np.array([0, 1], np.int32), np.ones(2), 1, keep=True))
    assert best["parts"] == [0]
    a.take.remote(np.arange(2), [2], [(5, 5)], 2)
    [summed] = ray.get(a.give.remote([(5, 5)]))
    np.testing.assert_array_equal(summed["dense"], parent + slice_)   # the new batch: its parent and the slice
    pool.shutdown()


def test_an_actor_starts_numba_as_it_starts_with_a_kernel_its_batches_call_as_it_was_called(ray_session):
    """numba's start in an actor's process (~0.4-1 s on 2 cores) is paid as the actor starts,
    beside other work, not in the first slice it sums, where it held up a round: with the sum of
    a uint16 batch's slice of uint8 counts, whose arguments have the types a batch's slices
    arrive with (read-only: through the object store or inside the call), so a batch calls the
    very kernel loaded at the start, and no other is compiled then (a fresh cache compiles only it)."""
    import ray

    from workloads.forest.histogram_pool import HistogramPool
    from workloads.forest.shuffle import encode_partial

    def loaded(actor):
        from workloads.forest import histogram_kernels, shuffle
        return [str(s) for s in shuffle._add_sparse.signatures], len(histogram_kernels._best_splits.signatures)

    pool = HistogramPool(actor_cpus=0.0, in_group=False, max_failures=0)
    pool.ensure(1)
    [a] = pool.actors
    at_start = ray.get(a.__ray_call__.remote(loaded))
    assert len(at_start[0]) == 1 and at_start[1] == 0  # one kernel, not every one it may call
    rng = np.random.default_rng(2)
    shape = (4, 1000, 51)
    slices = []
    for cells in (30_000, 10):  # a slice through the object store, one inside the call
        hist = np.zeros(shape, np.uint16)
        hist.reshape(-1)[rng.choice(hist.size, cells, replace=False)] = rng.integers(1, 9, cells)
        slices.append(encode_partial(hist))
        assert "index" in slices[-1] and slices[-1]["count"].dtype == np.uint8
    ray.get(a.reset.remote(*shape, "uint16", None, 1))
    ray.get([a.add.remote(part, 0, s) for part, s in enumerate(slices)])
    col_start, col_class = np.array([0, 2, 4], np.int32), np.array([0, 1, 0, 1], np.int32)
    assert ray.get(a.best.remote(col_start, col_class, np.ones(2), 1))["parts"] == [0, 1]
    assert ray.get(a.__ray_call__.remote(loaded))[0] == at_start[0]
    pool.shutdown()
