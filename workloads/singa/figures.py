"""singa's pictures in MLflow (``figures/``): how the net learned under its architecture, and what
its hidden layers learned.

- ``learning_curves.png``: per epoch, the losses (train, test; pre-training stages'
  reconstruction errors) and the test accuracy against the app's target, titled with the app
  and the architecture (``singa.arch``): runs of one app under different archs compare side by
  side in MLflow and in ``notebooks/singa_architectures.ipynb``;
- ``tsne_<layer>.png``: 2-d t-SNE of a hidden layer's features on test images, one colour per
  class (Appendix A, Fig. 7/8/15).
"""
from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from orchard.figures import logged_series, pyplot

_NOT_CURVES = ("throughput/", "time/", "comm/", "system/", "tsne/", "reached_target")


def log_learning_curves(ctx, app: str, arch: str, target: float | None) -> None:
    """Draw the run's per-epoch losses and accuracies (as logged) into ``learning_curves.png``."""
    series = logged_series(ctx, lambda k: not any(p in k for p in _NOT_CURVES)
                           and k.rsplit("/", 1)[-1].split("_")[-1] in ("loss", "accuracy", "error"))
    if not series:
        return
    plt = pyplot()
    fig = learning_curves_figure(series, f"singa.app={app}, singa.arch={arch}", target)
    ctx.log_figure(fig, "figures/learning_curves.png")
    plt.close(fig)


def learning_curves_figure(series: dict[str, tuple[list[int], list[float]]], title: str, target: float | None):
    """Left: every loss / reconstruction-error series; right: every accuracy series (epochs on x)."""
    plt = pyplot()
    losses = {k: v for k, v in series.items() if not k.endswith("accuracy")}
    accs = {k: v for k, v in series.items() if k.endswith("accuracy")}
    panels = [p for p in ((losses, "loss / reconstruction error"), (accs, "accuracy")) if p[0]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    for ax, (group, ylabel) in zip(axes[0], panels):
        for key, (steps, values) in group.items():
            ax.plot(steps, values, marker="o", ms=4, label=key)
        if ylabel == "accuracy":
            if target is not None:
                ax.axhline(target, color="tab:red", lw=1, ls="--", label=f"target {target:g}")
            ax.set_ylim(0, 1.02)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def tsne_figure(features: np.ndarray, labels: np.ndarray, title: str, seed: int = 0):
    """(N, D) features and (N,) class ids -> a matplotlib figure of the 2-d t-SNE embedding,
    one colour per class."""
    from sklearn.manifold import TSNE

    plt = pyplot()
    features = features.reshape(len(features), -1).astype(np.float32)
    perplexity = float(min(30.0, max(5.0, (len(features) - 1) / 4)))
    emb = TSNE(n_components=2, perplexity=perplexity, init="pca", max_iter=500, random_state=seed).fit_transform(features)
    fig, ax = plt.subplots(figsize=(5.6, 5))
    sc = ax.scatter(emb[:, 0], emb[:, 1], c=labels, cmap="tab10", s=10)
    ax.legend(*sc.legend_elements(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, title="class")
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    return fig
