"""workloads/forest/shuffle.py: a partial histogram travels sparse or dense and adds where its features belong."""
from __future__ import annotations

import numpy as np
import pytest



@pytest.mark.parametrize("density,dtype,top", [(0.01, np.uint8, 3), (0.01, np.uint16, 300), (0.9, np.uint16, 70000),
                                               (0.0, np.uint8, 0)])
def test_a_partial_travels_sparse_or_dense_and_adds_where_its_features_belong(density, dtype, top):
    """shuffle.encode_partial picks the smaller encoding (sparse deep in the tree, dense near the
    root) with counts as narrow as its largest, and add_partial puts a feature partition's slice at
    its features of the receiver's histogram: the same sums as numpy's dense add."""
    from workloads.forest.shuffle import add_partial, encode_partial, encoded_bytes

    rng = np.random.default_rng(7)
    wide = np.int32 if top >= 2**16 else dtype
    part = (rng.integers(1, max(top, 1) + 1, (6, 5, 9)) * (rng.random((6, 5, 9)) < density)).astype(wide)
    if top:
        part.flat[0] = top
    encoded = encode_partial(part)
    sparse = "index" in encoded
    assert sparse == (density < 0.5)                    # an empty slice: no cells at all
    counts = encoded["count"] if sparse else encoded["dense"]
    assert counts.dtype == (np.uint8 if top < 256 else np.uint16 if top < 2**16 else np.int32)
    assert encoded_bytes(encoded) <= part.size * counts.dtype.itemsize
    receiver = rng.integers(0, 5, (7, 12, 9)).astype(np.int64)
    expected = receiver.copy()
    expected[:6, 4:9] += part
    add_partial(receiver, 4, encoded)
    np.testing.assert_array_equal(receiver, expected)
