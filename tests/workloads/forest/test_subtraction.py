"""workloads/forest/subtraction.py: a sibling's histogram as its parent's minus the other's, exact."""
from __future__ import annotations

import numpy as np



def test_histogram_subtraction_is_exact_where_the_parent_overflows_the_childrens_width():
    """The larger child's histogram is the parent's minus the smaller's, in the batch's narrow
    counts (uint8 here: the children's columns fit it) even where the parent's do not: the
    parent is cast and subtracted modulo 256, and the true result fits (subtraction.py)."""
    from workloads.forest.subtraction import apply_init, subtract_siblings

    rng = np.random.default_rng(0)
    small = rng.integers(0, 120, (2, 5, 7))     # the smaller child: classes 3 and 7
    large = rng.integers(100, 256, (3, 5, 7))   # the larger child: classes 3, 7 and 9
    parent = large.astype(np.uint16)            # the parent's columns of the larger child's classes
    parent[:2] += small.astype(np.uint16)
    assert parent.max() > 255
    hist = np.zeros((5, 5, 7), np.uint8)        # the batch: smaller child's columns 0-1, larger's 2-4
    apply_init(hist, [(2, parent)])             # with the reset: the parent's columns, mod 256
    hist[:2] += small.astype(np.uint8)          # phase 2 counted the smaller child only
    subtract_siblings(hist, [(2, 0), (3, 1)])   # classes 3 and 7 are in both; 9 only in the larger
    np.testing.assert_array_equal(hist[2:], large)
    np.testing.assert_array_equal(hist[:2], small)
