"""workloads/forest/subtraction.py: a sibling's histogram as its parent's minus the other's, exact."""
from __future__ import annotations

import numpy as np


def test_histogram_subtraction_is_exact_where_the_parent_overflows_the_childrens_width():
    """The larger child's histogram is the parent's minus the smaller's, in the batch's narrow
    counts (uint8 here: the children's columns fit it) even where the parent's do not: the
    parent is cast and subtracted modulo 256, and the true result fits (subtraction.py)."""
    from workloads.forest.shuffle import dense_partial
    from workloads.forest.subtraction import apply_init, subtract_siblings

    rng = np.random.default_rng(0)
    small = rng.integers(0, 120, (2, 5, 7))     # the smaller child: classes 3 and 7
    large = rng.integers(100, 256, (3, 5, 7))   # the larger child: classes 3, 7 and 9
    parent = large.astype(np.uint16)            # the parent's columns of the larger child's classes
    parent[:2] += small.astype(np.uint16)
    assert parent.max() > 255
    hist = np.zeros((5, 5, 7), np.uint8)        # the batch: smaller child's columns 0-1, larger's 2-4
    apply_init(hist, [(2, dense_partial(parent))])  # with the reset: the parent's columns, mod 256
    hist[:2] += small.astype(np.uint8)          # phase 2 counted the smaller child only
    subtract_siblings(hist, [(2, 0), (3, 1)])   # classes 3 and 7 are in both; 9 only in the larger
    np.testing.assert_array_equal(hist[2:], large)
    np.testing.assert_array_equal(hist[:2], small)


def _summed(actor, hist):
    import ray

    ray.get(actor.reset.remote(*hist.shape, str(hist.dtype)))
    ray.get(actor.add.remote(0, 0, {"shape": np.asarray(hist.shape, np.int64), "dense": hist}))


def test_parents_stay_with_the_actor_that_summed_them_and_only_crossings_count(ray_session):
    """An actor's `take` keeps each parent's columns in its own memory, the driver noting where
    (`Held`); in the next batch a reducer starts from its own parents in place and from another
    actor's as given to it, one object per pair (route_inits), exactly as the dense columns; only
    a parent held on another node than its reducer's adds its bytes to `wire_bytes`."""
    import ray

    from workloads.forest.histogram_actor import HistogramActor
    from workloads.forest.subtraction import Held, ParentStore, plan_derivations, route_inits

    rng = np.random.default_rng(1)
    hist = rng.integers(0, 300, (6, 40, 9)).astype(np.uint16)
    a, b = (ray.remote(HistogramActor).remote() for _ in range(2))
    _summed(a, hist)
    # parent 11: columns 0 and 4; parent 21: columns 1, 2, 5 (round 1)
    keys = [(0, 11), (0, 21)]
    assert ray.get(a.take.remote(np.array([0, 4, 1, 2, 5]), [2, 3], keys, 1)) is True
    store = ParentStore(2**30)
    wanted = [(11, 12, np.array([0, 4]), None, 2 * 40 * 9 * 2), (21, 22, np.array([1, 2, 5]), None, 3 * 40 * 9 * 2)]
    store.keep(wanted, [Held(0, k) for k in keys], node="node-a")
    assert store.nbytes() == 5 * 40 * 9 * 2 and store.held[21].counts == Held(0, (0, 21))
    # round 2: actor a (index 0) derives 21's child from its own, actor b (index 1) 11's, given
    inits = route_inits([[(0, store.held[21].counts)], [(3, store.held[11].counts)]],
                        lambda j, ks: [a, b][j].give.remote(ks))
    assert inits[0] == [(0, ("held", (0, 21)))] and inits[1][0][1][1] == 0
    assert ray.get(a.reset.remote(7, 40, 9, "uint16", inits[0], 2)) is True
    assert ray.get(b.reset.remote(7, 40, 9, "uint16", ray.put(inits[1]), 2)) is True
    out_a, out_b = (ray.get(x.best.remote(np.array([0, 7]), np.zeros(7, np.int32), np.ones(1), 1, keep=True))
                    for x in (a, b))
    assert out_a["parts"] == out_b["parts"] == []
    for x, rows, at in ((a, [1, 2, 5], 0), (b, [0, 4], 3)):
        assert ray.get(x.take.remote(np.arange(7), [7], [(9, 9)], 2))  # the started histogram, back
        [started] = ray.get(x.give.remote([(9, 9)]))
        np.testing.assert_array_equal(started["dense"][at:at + len(rows)], hist[rows])
    # given and used, they are held no more: a second reset from them says so
    assert ray.get(a.reset.remote(7, 40, 9, "uint16", inits[0], 2)) is False
    # a batch where 21's reducer is on node b, 11's on node a: only 21's bytes cross
    batch = [21, 22, 11, 12]
    col_class = np.array([1, 2, 5, 1, 2, 5, 0, 4, 0, 4])  # each node's classes, in column order
    col_start = np.array([0, 3, 6, 8, 10])
    plan = plan_derivations(store, batch, [0, 2, 4], col_start, col_class, ["node-b", "node-a"])
    assert plan["derived"].tolist() == [True, False, True, False]
    assert store.wire_bytes == store.held[21].nbytes
    for x in (a, b):
        ray.kill(x)


def test_parents_older_than_the_last_round_are_dropped_and_a_missing_one_says_so(ray_session):
    """A reset drops what was taken before the last round (no batch needs it); a parent that
    cannot be had (dropped, its actor restarted, or its giver's node gone with the object) makes
    the reset answer False with no batch, so the driver counts the batch in full (train.py);
    resolve_init raises ParentsLost for it."""
    import time

    import pytest
    import ray

    from workloads.forest.histogram_actor import HistogramActor
    from workloads.forest.subtraction import ParentsLost, resolve_init

    hist = np.ones((2, 3, 4), np.uint8)
    actor = ray.remote(HistogramActor).remote()
    _summed(actor, hist)
    assert ray.get(actor.take.remote(np.array([0, 1]), [2], [(0, 5)], 3))
    assert ray.get(actor.reset.remote(2, 3, 4, "uint8", None, 5)) is True  # round 5: round 3's are gone
    assert ray.get(actor.give.remote([(0, 5)])) == [None]
    assert ray.get(actor.reset.remote(2, 3, 4, "uint8", [(0, ("held", (0, 5)))], 5)) is False
    assert ray.get(actor.add.remote(0, 0, {"shape": np.array([2, 3, 4]), "dense": hist})) == -1  # no batch

    @ray.remote
    class Holder:  # owns what it puts: when it dies, the object is gone for everyone
        def put(self):
            # big enough for the object store (small objects travel inlined, copied into each ref)
            return [ray.put([{"shape": np.array([1, 1000, 1000]), "dense": np.ones((1, 1000, 1000), np.uint8)}])]

        def ping(self):
            return True

    holder = Holder.remote()
    [gone] = ray.get(holder.put.remote())
    ray.kill(holder)
    # ray.kill is asynchronous: a ping sent at once can still run before the kill lands (a full
    # suite run saw one answer), so the holder is dead once a ping fails, within 100 tries
    for _ in range(100):
        try:
            ray.get(holder.ping.remote(), timeout=10)
            time.sleep(0.1)
        except ray.exceptions.RayActorError:
            break
    else:
        raise AssertionError("the killed holder still answers")
    for _ in range(100):  # the owner's death reaches the object's store a moment later
        try:
            ray.get(gone, timeout=5)
            time.sleep(0.1)
        except ray.exceptions.OwnerDiedError:
            break
    with pytest.raises(ParentsLost):
        resolve_init([(0, (gone, 0))], timeout_s=10)
    assert ray.get(actor.reset.remote(2, 1000, 1000, "uint8", ray.put([(0, (gone, 0))]), 6)) is False
    ray.kill(actor)
