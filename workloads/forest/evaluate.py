"""The forest against the truth: labels of the held-out images, accuracy per pixel and per part.

As in the Kinect pipeline the classifier labels the person's pixels (the depth camera
segments players from the background first), so evaluation covers every pixel whose
ground truth is a body part and that has a depth reading. The paper's two figures of merit:
per-pixel accuracy and mean per-class accuracy (over the parts present in the truth).
"""
from __future__ import annotations

import numpy as np

from .body_parts import BACKGROUND, NUM_PARTS, PART_NAMES
from .model import pack_forest, predict_images


def confusion_matrix(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """(C, C) int64 counts, rows = true part, columns = predicted part, body pixels only."""
    body = truth < NUM_PARTS
    flat = truth[body].astype(np.int64) * NUM_PARTS + predicted[body]
    return np.bincount(flat, minlength=NUM_PARTS * NUM_PARTS).reshape(NUM_PARTS, NUM_PARTS)


def accuracy_metrics(confusion: np.ndarray) -> dict:
    """Per-pixel accuracy and mean per-class accuracy (over parts present in the truth)."""
    per_class_total = confusion.sum(axis=1)
    present = per_class_total > 0
    per_class = np.diag(confusion)[present] / per_class_total[present]
    return {"pixel_accuracy": float(np.trace(confusion) / max(confusion.sum(), 1)),
            "mean_class_accuracy": float(per_class.mean()) if present.any() else 0.0,
            "class_accuracy": {int(c): float(a) for c, a in zip(np.nonzero(present)[0], per_class)}}


def evaluate(trees, class_weights, test_refs, forest_cfg, ctx, step: int = 0) -> tuple[dict, dict]:
    """Metrics of the finished forest on the held-out blocks; per-part accuracy as
    `test/class_acc/<part>` at `step` (the last round's), the confusion table as
    `tables/confusion.json`. Returns (metrics, what the figures draw: depths, truth and
    predicted labels (background where not scored), confusion, class_accuracy)."""
    import ray

    blocks = ray.get(test_refs)
    depths = np.concatenate([b["depths"] for b in blocks])
    truth = np.concatenate([b["labels"] for b in blocks])
    mask = (truth != BACKGROUND) & (depths > 0)
    predicted, pixels_per_s = predict_images(pack_forest(trees, class_weights), depths, mask,
                                             forest_cfg["background_mm"])
    confusion = confusion_matrix(np.where(mask, truth, BACKGROUND), predicted)
    acc = accuracy_metrics(confusion)
    labelled = {"depths": depths, "truth": np.where(mask, truth, BACKGROUND), "predicted": predicted,
                "confusion": confusion, "class_accuracy": acc["class_accuracy"]}
    ctx.log_dict({"parts": list(PART_NAMES), "confusion": confusion.tolist()}, "tables/confusion.json")
    per_class = {f"test/class_acc/{PART_NAMES[c]}": v for c, v in acc["class_accuracy"].items()}
    ctx.log_metrics(per_class, step=step)  # in MLflow; the summary shows the headline below
    worst = min(acc["class_accuracy"], key=acc["class_accuracy"].get) if per_class else None
    return {"test/pixel_accuracy": acc["pixel_accuracy"],
            "test/mean_class_accuracy": acc["mean_class_accuracy"],
            "test/worst_class_accuracy": acc["class_accuracy"][worst] if per_class else 0.0,
            "test/pixels": float(mask.sum()),
            "throughput/inference_pixels_per_s": pixels_per_s}, labelled
