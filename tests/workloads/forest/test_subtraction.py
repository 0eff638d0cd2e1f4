"""workloads/forest/subtraction.py: a sibling's histogram as its parent's minus the other's, exact."""
from __future__ import annotations

import numpy as np



def test_histogram_subtraction_is_exact_where_the_parent_overflows_the_childrens_width():
    """The larger child's histogram is the parent's minus the smaller's, in the batch's narrow
    counts (uint8 here: the children's columns fit it) even where the parent's do not: the
    parent is cast and subtracted modulo 256, and the true result fits (subtraction.py)."""
    from workloads.forest.shuffle import encode_partial
    from workloads.forest.subtraction import apply_init, subtract_siblings

    rng = np.random.default_rng(0)
    small = rng.integers(0, 120, (2, 5, 7))     # the smaller child: classes 3 and 7
    large = rng.integers(100, 256, (3, 5, 7))   # the larger child: classes 3, 7 and 9
    parent = large.astype(np.uint16)            # the parent's columns of the larger child's classes
    parent[:2] += small.astype(np.uint16)
    assert parent.max() > 255
    hist = np.zeros((5, 5, 7), np.uint8)        # the batch: smaller child's columns 0-1, larger's 2-4
    apply_init(hist, [(2, encode_partial(parent))])  # with the reset: the parent's columns, mod 256
    hist[:2] += small.astype(np.uint8)          # phase 2 counted the smaller child only
    subtract_siblings(hist, [(2, 0), (3, 1)])   # classes 3 and 7 are in both; 9 only in the larger
    np.testing.assert_array_equal(hist[2:], large)
    np.testing.assert_array_equal(hist[:2], small)
    sparse = np.zeros((3, 5, 7), np.uint16)       # a deep parent: few cells, some past 255
    sparse[0, 1, 2], sparse[2, 4, 6] = 300, 7
    encoded = encode_partial(sparse)
    assert "index" in encoded
    hist = np.zeros((5, 5, 7), np.uint8)
    apply_init(hist, [(2, encoded)])
    np.testing.assert_array_equal(hist[2:], sparse % 256)
    assert not hist[:2].any()


def test_parents_travel_encoded_and_each_keeps_only_its_own_columns():
    """An actor's `take` (every kept parent's columns, stacked) travels as a partial, encoded
    across nodes; the store cuts it into one parent each, and a parent starts its derived columns
    exactly as the dense columns would, whichever form: sparse deep in the tree, dense near the
    root, dense as taken on one node."""
    from workloads.forest.shuffle import dense_partial, encode_partial, encoded_bytes
    from workloads.forest.subtraction import apply_init, ParentStore

    rng = np.random.default_rng(1)
    for density, form in ((0.01, encode_partial), (0.9, encode_partial), (0.01, dense_partial)):
        stacked = (rng.random((5, 40, 9)) < density) * rng.integers(1, 300, (5, 40, 9))
        stacked = stacked.astype(np.uint16)
        taken = form(stacked)
        assert ("index" in taken) == (density < 0.5 and form is encode_partial)
        store = ParentStore(2**30)
        wanted = [(11, 12, np.array([0, 4]), None, 2 * 40 * 9 * 2), (21, 22, np.array([1, 2, 5]), None, 3 * 40 * 9 * 2)]
        store.keep(wanted, taken)
        assert store.wire_bytes == encoded_bytes(taken) and store.nbytes() == 5 * 40 * 9 * 2
        hist = np.zeros((7, 40, 9), np.uint16)
        apply_init(hist, [(0, store.held[21].counts), (3, store.held[11].counts)])
        np.testing.assert_array_equal(hist[:3], stacked[2:])
        np.testing.assert_array_equal(hist[3:5], stacked[:2])
        assert not hist[5:].any()
        store.keep(wanted, form(stacked[:4]))  # a take of other columns than asked keeps nothing new
        assert store.wire_bytes == encoded_bytes(taken)
