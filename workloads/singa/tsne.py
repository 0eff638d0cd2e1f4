"""t-SNE of layer features for a sample of test data (Appendix A, Fig. 7/8/15)."""
from __future__ import annotations

import numpy as np


def tsne_figure(features: np.ndarray, labels: np.ndarray, title: str, seed: int = 0):
    """(N, D) features and (N,) class ids -> a matplotlib figure of the 2-d t-SNE embedding,
    one colour per class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE

    features = features.reshape(len(features), -1).astype(np.float32)
    perplexity = float(min(30.0, max(5.0, (len(features) - 1) / 4)))
    emb = TSNE(n_components=2, perplexity=perplexity, init="pca", max_iter=500, random_state=seed).fit_transform(features)
    fig, ax = plt.subplots(figsize=(5, 5))
    sc = ax.scatter(emb[:, 0], emb[:, 1], c=labels, cmap="tab10", s=6)
    ax.legend(*sc.legend_elements(), loc="best", fontsize=6, title="class")
    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    return fig


def neighbourhood_purity(features: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """Share of each point's k nearest neighbours (in feature space) with its class: how well a
    layer's features cluster by semantics, the quantity Fig. 15 shows by eye."""
    from sklearn.neighbors import NearestNeighbors

    x = features.reshape(len(features), -1)
    idx = NearestNeighbors(n_neighbors=k + 1).fit(x).kneighbors(x, return_distance=False)[:, 1:]
    return float((labels[idx] == labels[:, None]).mean())
