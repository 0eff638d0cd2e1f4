"""How well a layer's features cluster by class (Appendix A); the t-SNE picture is in figures.py."""
from __future__ import annotations

import numpy as np


def neighbourhood_purity(features: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """Share of each point's k nearest neighbours (in feature space) with its class: how well a
    layer's features cluster by semantics, the quantity Fig. 15 shows by eye."""
    from sklearn.neighbors import NearestNeighbors

    x = features.reshape(len(features), -1)
    idx = NearestNeighbors(n_neighbors=k + 1).fit(x).kneighbors(x, return_distance=False)[:, 1:]
    return float((labels[idx] == labels[:, None]).mean())
