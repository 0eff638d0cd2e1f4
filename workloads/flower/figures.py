"""flower's pictures in MLflow (``figures/``): what the CNN counted where, and how well per bin.

- ``density_maps.png``: test tiles with the annotated flower centres, and the CNN's density map
  over the same tile, titled with the manual count, the CNN's count and the blob counter's
  (thesis Fig. 3.5 / 5.4);
- ``per_bin_mae.png``: MAE per count bin and scene kind, the CNN beside the blob counter (Table 5.1);
- ``counts_scatter.png``: predicted against manual count for every test tile, both counters.
"""
from __future__ import annotations

import numpy as np

from orchard.api import pyplot

CNN_COLOUR, BLOB_COLOUR = "tab:blue", "tab:orange"


def log_figures(ctx, *, picks: list[int], images: np.ndarray, points: list[np.ndarray], maps: np.ndarray,
                truth: np.ndarray, cnn_counts: np.ndarray, blob_counts: np.ndarray, names: list[str],
                cnn_table: dict, blob_table: dict) -> None:
    """Draw and log the three figures. Over the test tiles: ``images`` (N, T, T, 3) uint8,
    ``points`` their flower centres ((K, 2) x, y pixels each), ``maps`` (N, T, T) the CNN's
    flowers per pixel, the three counts (N,) and ``names``; ``picks`` the tiles to show; the
    tables are ``evaluate.error_table``'s."""
    plt = pyplot()
    for name, fig in (("density_maps", density_figure(images[picks], [points[i] for i in picks], maps[picks],
                                                      truth[picks], blob_counts[picks], [names[i] for i in picks])),
                      ("per_bin_mae", per_bin_figure(cnn_table, blob_table)),
                      ("counts_scatter", counts_scatter(truth, cnn_counts, blob_counts))):
        ctx.log_figure(fig, f"figures/{name}.png")
        plt.close(fig)


def density_figure(images: np.ndarray, points: list[np.ndarray], predicted_maps: np.ndarray,
                   truth_counts: np.ndarray, blob_counts: np.ndarray, names: list[str]):
    """Top row: each tile with its annotated flower centres (white rings). Bottom row: the CNN's
    density map over the tile, opaque where the density is high (one colour scale for all);
    the title gives the three counts."""
    from matplotlib import cm, colors

    plt = pyplot()
    n = len(images)
    fig, axes = plt.subplots(2, n, figsize=(2.6 * n + 1.0, 5.8), squeeze=False, layout="constrained")
    top = max(float(predicted_maps.max()) if predicted_maps.size else 0.0, 1e-6)
    scale = colors.Normalize(0, top)
    for j in range(n):
        tile = images[j]
        ax = axes[0, j]
        ax.imshow(tile)
        pts = np.asarray(points[j]).reshape(-1, 2)
        if len(pts):
            ax.scatter(pts[:, 0], pts[:, 1], s=60, facecolors="none", edgecolors="white", linewidths=1.2)
        ax.set_title(f"{names[j]}\nmanual count {truth_counts[j]:.0f}", fontsize=8)
        ax = axes[1, j]
        ax.imshow(tile)
        # the density as colour whose opacity grows with it: the tile shows where the CNN saw nothing
        overlay = cm.inferno(scale(predicted_maps[j]))
        overlay[..., 3] = np.clip(scale(predicted_maps[j]), 0, 1) * 0.9
        ax.imshow(overlay)
        ax.set_title(f"CNN {predicted_maps[j].sum():.1f} | blobs {blob_counts[j]:.0f} "
                     f"| true {truth_counts[j]:.0f}", fontsize=8)
        for i in range(2):
            axes[i, j].set_xticks([])
            axes[i, j].set_yticks([])
    axes[0, 0].set_ylabel("tile + annotated flowers", fontsize=8)
    axes[1, 0].set_ylabel("CNN density over the tile", fontsize=8)
    fig.colorbar(cm.ScalarMappable(scale, "inferno"), ax=axes[1, :].tolist(), shrink=0.9,
                 label="flowers per pixel")
    fig.suptitle("held-out tiles: annotation (top) and the CNN's density map (bottom)", fontsize=10)
    return fig


def per_bin_figure(cnn_table: dict, blob_table: dict):
    """Bar chart: MAE per count bin and scene kind, the CNN next to the blob counter."""
    plt = pyplot()
    rows = [r for r in cnn_table if cnn_table[r]["tiles"] > 0]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(5.5, 0.9 * len(rows)), 3.4))
    cnn = ax.bar(x - 0.2, [cnn_table[r]["mae"] for r in rows], 0.4, label="CNN", color=CNN_COLOUR)
    blob = ax.bar(x + 0.2, [blob_table[r]["mae"] for r in rows], 0.4, label="blob counter (3.3.3)",
                  color=BLOB_COLOUR)
    for bars in (cnn, blob):
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(x, [f"{r}\n({int(cnn_table[r]['tiles'])} tiles)" for r in rows], rotation=0, fontsize=7)
    ax.set_ylabel("MAE (flowers per tile)")
    ax.set_title("count error per bin (held-out tiles)", fontsize=10)
    ax.margins(y=0.15)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def counts_scatter(truth: np.ndarray, cnn: np.ndarray, blobs: np.ndarray):
    """Predicted against manual count per test tile; the diagonal is a perfect counter."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.4, 4.2))
    rng = np.random.default_rng(0)
    jitter = rng.uniform(-0.12, 0.12, len(truth))  # counts are integers: spread overlapping tiles
    ax.scatter(truth + jitter, blobs, s=14, alpha=0.6, color=BLOB_COLOUR,
               label=f"blob counter (MAE {np.mean(np.abs(blobs - truth)):.2f})")
    ax.scatter(truth + jitter, cnn, s=14, alpha=0.7, color=CNN_COLOUR,
               label=f"CNN (MAE {np.mean(np.abs(cnn - truth)):.2f})")
    top = float(max(truth.max(initial=0), cnn.max(initial=0), blobs.max(initial=0))) + 1
    ax.plot([0, top], [0, top], color="grey", lw=1, ls="--", label="perfect counter")
    ax.set_xlim(-0.5, top)
    ax.set_ylim(-0.5, top)
    ax.set_xlabel("manual count")
    ax.set_ylabel("predicted count")
    ax.set_title(f"{len(truth)} held-out tiles", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
