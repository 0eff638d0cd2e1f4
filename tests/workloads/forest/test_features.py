"""workloads/forest/features.py: the depth-comparison feature (Appendix A, eq. 1) by hand."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.forest.features import feature_response

from .helpers import BG


def test_feature_formula_by_hand():
    depths = np.zeros((1, 5, 7), np.uint16)
    depths[0, 2, 3] = 2000          # the pixel x: 2 m away
    depths[0, 2, 5] = 2100          # x + u/d: u = (0, 4) pixel-metres -> 4 / 2 m = 2 px right
    depths[0, 0, 3] = 1500          # x + v/d: v = (-4, 0) -> 2 px up
    # f = d(x + u/d(x)) - d(x + v/d(x)) = 2100 - 1500
    assert feature_response(depths, 0, 2, 3, 0.0, 4.0, -4.0, 0.0, BG) == pytest.approx(600.0)
    # v = 0 compares the probe with the pixel itself
    assert feature_response(depths, 0, 2, 3, 0.0, 4.0, 0.0, 0.0, BG) == pytest.approx(100.0)
    # a probe off the image, or on a pixel with no reading, reads the large constant
    assert feature_response(depths, 0, 2, 3, 0.0, 20.0, 0.0, 0.0, BG) == pytest.approx(10000 - 2000)
    assert feature_response(depths, 0, 2, 3, 2.0, 0.0, 0.0, 0.0, BG) == pytest.approx(10000 - 2000)
    # depth invariance: twice as far, the same world offset lands half as many pixels away
    depths[0, 2, 3] = 4000
    depths[0, 2, 4] = 4300
    assert feature_response(depths, 0, 2, 3, 0.0, 4.0, 0.0, 0.0, BG) == pytest.approx(300.0)
