"""video's pictures in MLflow (``figures/``): what the fused model confuses, how each stream
learned, where the pipeline spent its time, and which windows of an untrimmed video it kept.

- ``confusion_matrix.png``: validation videos, the winning fusion's predictions (as the
  aggregation table scored them: cross-validated for the fitted methods);
- ``learning_curves.png``: per stream, the training loss per step and the top-1 per epoch
  (train and validation) against chance;
- ``pipeline_timeline.png``: the run's phases on one time axis, and per training epoch the busy
  time of every stage (decode, each feature's extraction, each stream's trainers);
- ``highlights.png``: per untrimmed video, each window's fused confidence and motion, the
  windows kept as highlights against the true action's frames, and the predicted label.
"""
from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from orchard.api import logged_series, pyplot

PHASE_NAMES = {"data": "index videos", "val": "validation features + scoring", "train": "training epochs",
               "aggregation": "fit fusions", "inference": "untrimmed inference"}


def log_figures(ctx, *, classes: list[str], labels: np.ndarray, fused: dict[str, np.ndarray], winner: str,
                streams: dict[str, dict], features: list[str], phases: dict[str, float], train_start_s: float,
                records: list[dict], window_frames: int) -> None:
    """Draw and log the four figures. ``fused`` method -> (V, C) validation scores, ``labels`` (V,);
    ``streams`` stream -> {"feature", ...}; ``phases`` seconds per run phase, ``train_start_s``
    when training began (s after the run's start); ``records`` the untrimmed predictions
    (inference.run_inference) with ``window_frames`` frames per window."""
    plt = pyplot()
    series = logged_series(ctx, lambda k: k.startswith(("train/", "val/", "pipeline/", "time/epoch_s")))
    figures = {"confusion_matrix": confusion_figure(fused[winner], labels, classes, winner)}
    if series:
        figures["learning_curves"] = learning_curves_figure(series, list(streams), 1.0 / len(classes))
        figures["pipeline_timeline"] = timeline_figure(series, phases, train_start_s, features, list(streams))
    if records:
        figures["highlights"] = highlights_figure(records, window_frames)
    for name, fig in figures.items():
        ctx.log_figure(fig, f"figures/{name}.png")
        plt.close(fig)


def confusion_figure(scores: np.ndarray, labels: np.ndarray, classes: list[str], method: str):
    """Counts of (true, predicted) class over the validation videos, row shares as colour."""
    plt = pyplot()
    n = len(classes)
    counts = np.zeros((n, n), int)
    np.add.at(counts, (np.asarray(labels, int), scores.argmax(1)), 1)
    shares = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    size = max(4.0, 0.45 * n + 2.5)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    if n <= 25:
        for i in range(n):
            for j in range(n):
                if counts[i, j]:
                    ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8,
                            color="white" if shares[i, j] > 0.6 else "black")
    ax.set_xticks(range(n), classes, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), classes, fontsize=8)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    top1 = float(np.trace(counts) / max(counts.sum(), 1))
    ax.set_title(f"validation videos, fusion={method}: top-1 {top1:.2f} ({counts.sum()} videos)", fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.8, label="share of the true class")
    fig.tight_layout()
    return fig


def learning_curves_figure(series: dict, streams: list[str], chance: float):
    """Left: each stream's training loss per step; right: its train and validation top-1 per epoch."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 3.8))
    colours = dict(zip(streams, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for s in streams:
        steps, values = series.get(f"train/{s}_loss", ([], []))
        if steps:
            left.plot(steps, values, lw=0.8, alpha=0.35, color=colours[s])
            k = max(1, len(values) // 20)  # a running mean shows the trend through the batch noise
            smooth = np.convolve(values, np.ones(k) / k, mode="valid")
            left.plot(steps[k - 1:], smooth, lw=1.8, color=colours[s],
                      label=f"{s} (mean of {k} steps)" if k > 1 else s)
        for key, style, label in ((f"val/{s}_top1", "-o", "validation"), (f"train/{s}_top1", "--s", "train")):
            epochs, acc = series.get(key, ([], []))
            if epochs:
                right.plot(np.asarray(epochs) + 1, acc, style, color=colours[s], ms=5, label=f"{s} {label}")
    left.set_xlabel("training step")
    left.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    left.set_ylabel("cross-entropy loss")
    left.set_title("training loss per stream", fontsize=10)
    right.axhline(chance, color="grey", lw=1, ls=":", label=f"chance {chance:.2f}")
    last = max([max(series.get(f"val/{s}_top1", ([0], []))[0] or [0]) for s in streams] + [0]) + 1
    right.set_xlim(0.5, last + 0.5)
    right.set_ylim(0, 1.02)
    right.set_xlabel("epoch")
    right.set_ylabel("top-1 (segment average)")
    right.set_title("top-1 per stream", fontsize=10)
    right.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def timeline_figure(series: dict, phases: dict[str, float], train_start_s: float, features: list[str],
                    streams: list[str]):
    """Top row: the run's phases in order. Below, per stage, each training epoch's window (light)
    and the stage's busy time in it (dark: busy seconds per actor), annotated with the busy share."""
    plt = pyplot()
    epochs_at, windows = series.get("time/epoch_s", ([], []))
    rows = [("decode", "decode"), *[(f, f"extract {f}") for f in features],
            *[(s, f"train {s}") for s in streams]]
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.55 * (len(rows) + 1)))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # [1] the phases, one after the other (validation scoring during training counts in "train")
    t = 0.0
    top = len(rows)
    for i, phase in enumerate(("data", "val", "train", "aggregation", "inference")):
        if phase not in phases:
            continue
        start = train_start_s if phase == "train" else t
        width = phases[phase]
        ax.broken_barh([(start, width)], (top - 0.4, 0.8), color=colours[i % len(colours)], alpha=0.8,
                       label=f"{PHASE_NAMES[phase]} ({width:.0f} s)")
        t = start + width
    # [2] per stage and epoch: the window, and the busy seconds per actor in it
    for r, (stage, label) in enumerate(rows):
        y = len(rows) - 1 - r
        begin = train_start_s
        for epoch, window in zip(epochs_at, windows):
            ax.broken_barh([(begin, window)], (y - 0.35, 0.7), color="0.9", edgecolor="0.6", lw=0.5)
            if stage in streams:
                busy_share = 1.0 - _value_at(series, f"pipeline/{stage}_trainer_wait_fraction", epoch, 1.0)
            else:
                actors = max(_value_at(series, f"pipeline/{stage}_actors", epoch, 1.0), 1.0)
                busy_share = min(1.0, _value_at(series, f"pipeline/{stage}_busy_actors", epoch, 0.0) / actors)
            ax.broken_barh([(begin, busy_share * window)], (y - 0.35, 0.7), color=colours[(r + 5) % len(colours)])
            ax.text(begin + window / 2, y, f"{busy_share:.0%} busy", ha="center", va="center", fontsize=7)
            begin += window
    ax.set_yticks(range(len(rows) + 1), [label for _, label in reversed(rows)] + ["run phases"], fontsize=8)
    ax.set_xlabel("seconds since the run started")
    ax.set_title("where the time went: phases, and each stage's busy share of every training epoch "
                 "(light: the epoch, dark: busy)", fontsize=9)
    ax.set_xlim(0, max(t, train_start_s + sum(windows)) * 1.01 or 1)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(title="run phases (top row)", fontsize=7, title_fontsize=7, ncols=5, loc="upper center",
              bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    return fig


def _value_at(series: dict, key: str, step: int, default: float) -> float:
    steps, values = series.get(key, ([], []))
    for s, v in zip(steps, values):
        if s == step:
            return float(v)
    return default


def highlights_figure(records: list[dict], window_frames: int):
    """One panel per untrimmed video: fused confidence and motion per window (at its centre),
    the true action's frames shaded, and below each kept (highlight) window as a bar."""
    plt = pyplot()
    fig, axes = plt.subplots(len(records), 1, figsize=(10.5, 2.4 * len(records)), squeeze=False)
    for ax, rec in zip(axes[:, 0], records):
        windows = rec["windows"]
        offsets = np.array([w["offset"] for w in windows], float)
        centres = offsets + window_frames / 2
        conf = np.array([w["confidence"] for w in windows])
        motion = np.array([w["motion"] for w in windows])
        kept = np.array([w["highlight"] for w in windows], bool)
        start, end = rec.get("action_frames") or (None, None)
        if start is not None and end is not None:
            ax.axvspan(start, end, color="tab:green", alpha=0.18, label="true action")
        ax.plot(centres, conf, "-", color="tab:blue", lw=1.2, label="fused confidence")
        ax.scatter(centres[kept], conf[kept], color="tab:blue", s=28, zorder=3, label="kept window")
        ax.scatter(centres[~kept], conf[~kept], facecolors="none", edgecolors="tab:blue", s=28, zorder=3,
                   label="dropped window")
        if np.isfinite(motion).all() and motion.max() > motion.min():
            scaled = (motion - motion.min()) / (motion.max() - motion.min())
            ax.plot(centres, scaled, ":", color="tab:orange", lw=1.2, label="motion (scaled 0-1)")
        for lane, o in enumerate(offsets[kept]):  # two lanes: overlapping windows stay apart
            ax.broken_barh([(o, window_frames)], (-0.17 + 0.06 * (lane % 2), 0.05), color="tab:red", alpha=0.8)
        ax.text(offsets.min() if len(offsets) else 0, -0.11, "highlights ", ha="right", va="center", fontsize=7)
        ax.set_ylim(-0.2, 1.05)
        ax.set_xlim(0, (offsets.max() + window_frames) if len(offsets) else 1)
        ok = rec.get("truth") is not None and rec["label"] == rec["truth"]
        verdict = "" if rec.get("truth") is None else (" (right)" if ok else " (wrong)")
        name = str(rec["path"]).rsplit("/", 1)[-1]
        ax.set_title(f"{name}: true {rec.get('truth')}, predicted {rec['label']}{verdict}; "
                     f"{kept.sum()} of {len(kept)} windows kept", fontsize=9)
        ax.set_ylabel("confidence", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1, 0].set_xlabel("frame")
    fig.tight_layout()
    return fig
