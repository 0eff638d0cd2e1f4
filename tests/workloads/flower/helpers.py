"""Small in-memory tiles for the flower tests."""
from __future__ import annotations

import numpy as np


def random_tiles(n=24, size=32, seed=0):
    """Tiles (n, size, size, 3) uint8 and their flower points, as the tile cache holds them."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8)
    points = [rng.uniform(0, size, (int(rng.integers(0, 4)), 2)) for _ in range(n)]
    return images, points
