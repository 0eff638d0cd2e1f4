"""forest's pictures in MLflow (``figures/``): what the forest labelled, how well per part, and
where each round's time went.

- ``predicted_labelings.png``: held-out depth images, their ground-truth parts and the forest's;
- ``class_accuracy.png``: per-part accuracy, sorted, with the mean per-class accuracy;
- ``confusion_matrix.png``: row-normalised body-part confusion;
- ``phase_times.png``: seconds of each round's four phases (train.py), per tree and depth.
"""
from __future__ import annotations

import numpy as np

from orchard.api import pyplot

from .body_parts import BACKGROUND

PHASES = (("round/bin_cache_s", "0 bin cache (tasks, a tree's first round)"), ("round/phase1_s", "1 scan (tasks)"),
          ("round/phase2_s", "2 histograms (tasks)"),
          ("round/phase3_s", "3 best splits (actors)"), ("round/phase4_s", "4 grow + checkpoint (driver)"))


def log_figures(ctx, *, depths: np.ndarray, truth: np.ndarray, predicted: np.ndarray, palette: np.ndarray,
                confusion: np.ndarray, class_accuracy: dict, part_names, rounds: list[dict], images: int) -> None:
    """Draw and log the four figures. ``depths`` (N, H, W) mm, ``truth``/``predicted`` (N, H, W)
    part ids (background where not scored), ``rounds`` the round metrics of this run."""
    plt = pyplot()
    figures = {"predicted_labelings": labelings_figure(depths, truth, predicted, palette, images),
               "class_accuracy": class_accuracy_figure(class_accuracy, part_names),
               "confusion_matrix": confusion_figure(confusion, part_names)}
    if rounds:
        figures["phase_times"] = phase_times_figure(rounds)
    for name, fig in figures.items():
        ctx.log_figure(fig, f"figures/{name}.png")
        plt.close(fig)


def class_accuracy_figure(class_accuracy: dict, part_names):
    """Per-part accuracy (recall over that part's body pixels) as a sorted bar chart."""
    plt = pyplot()
    order = sorted(class_accuracy, key=class_accuracy.get)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(range(len(order)), [class_accuracy[c] for c in order], color="tab:blue")
    mean = float(np.mean(list(class_accuracy.values()))) if class_accuracy else 0.0
    ax.axhline(mean, color="tab:red", lw=1, label=f"mean per-class {mean:.3f}")
    ax.set_xticks(range(len(order)), [part_names[c] for c in order], rotation=90, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy on the part's pixels")
    ax.set_title(f"per-part accuracy (held-out images, {len(order)} parts present)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def confusion_figure(confusion: np.ndarray, part_names):
    """Row-normalised confusion matrix over the parts present in the truth or the predictions."""
    plt = pyplot()
    present = np.flatnonzero((confusion.sum(axis=1) + confusion.sum(axis=0)) > 0)
    sub = confusion[np.ix_(present, present)]
    rows = sub / np.maximum(sub.sum(axis=1, keepdims=True), 1)
    names = [part_names[i] for i in present]
    fig, ax = plt.subplots(figsize=(9, 8))
    im = ax.imshow(rows, cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("predicted part")
    ax.set_ylabel("true part")
    ax.set_title("body-part confusion (row-normalised, held-out pixels)")
    fig.colorbar(im, ax=ax, shrink=0.8, label="share of the true part's pixels")
    fig.tight_layout()
    return fig


def labelings_figure(depths, truth, predicted, palette: np.ndarray, count: int):
    """Depth | ground truth | forest, for the first ``count`` images; the forest's panel is
    titled with the image's accuracy over its scored body pixels."""
    plt = pyplot()
    count = min(count, len(depths))
    fig, axes = plt.subplots(count, 3, figsize=(9, 2.8 * count), squeeze=False)
    for i in range(count):
        d = depths[i].astype(np.float32)
        scored = truth[i] != BACKGROUND
        acc = float((predicted[i][scored] == truth[i][scored]).mean()) if scored.any() else float("nan")
        im = axes[i, 0].imshow(np.where(d > 0, d, np.nan), cmap="gray_r")
        fig.colorbar(im, ax=axes[i, 0], fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
        axes[i, 1].imshow(palette[truth[i]])
        axes[i, 2].imshow(palette[predicted[i]])
        titles = ("depth (mm)", "ground truth (body parts)", f"forest: {acc:.0%} of body pixels right")
        for ax, title in zip(axes[i], titles):
            ax.set_title(title, fontsize=8)
            ax.axis("off")
    fig.tight_layout()
    return fig


def phase_times_figure(rounds: list[dict]):
    """Stacked seconds of the four phases for each round, labelled tree/depth."""
    plt = pyplot()
    x = np.arange(len(rounds))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rounds) + 2), 3.8))
    bottom = np.zeros(len(rounds))
    for (key, label), colour in zip(PHASES, ("tab:purple", "tab:blue", "tab:orange", "tab:green", "tab:grey")):
        values = np.array([float(r.get(key, 0.0)) for r in rounds])
        ax.bar(x, values, 0.8, bottom=bottom, label=label, color=colour)
        bottom += values
    ax.set_xticks(x, [f"t{int(r['round/tree'])} d{int(r['round/depth'])}" for r in rounds],
                  rotation=90 if len(rounds) > 12 else 0, fontsize=7)
    ax.set_xlabel("round (tree, depth)")
    ax.set_ylabel("seconds")
    ax.set_title(f"where each round's time goes ({len(rounds)} rounds, {bottom.sum():.1f} s)", fontsize=10)
    ax.legend(fontsize=7, ncols=2, loc="upper left")
    ax.margins(y=0.25)
    fig.tight_layout()
    return fig
