"""Evaluation of the two streams and their fusion, against the truth and chance.

Every epoch, each stream's state is scored on the validation segments' features (computed once,
as they ride ahead of epoch 0 in the training pipeline, or by ``val_features`` where nothing is left
to train); after training, the fusion methods (aggregation.py) are compared on those
scores in a table, its winner tagged. Inference on untrimmed video (sliding windows, highlight
detection: inference.py) is scored by run.py with the winning fusion; the baseline is chance
(``val/chance_top1``, in run.py's final metrics).

Highlights against the truth: the kept windows merged into segments (``merge_windows``, which the
model's ``predict`` uses too), their tIoU and mAP at tIoU 0.5 against the true action frames, for
the untrimmed videos of a training run and for ``mode=predict`` over videos with ``segments.csv``.
"""
from __future__ import annotations

import numpy as np



def val_features(segments: list[dict], features: list[str], index, vcfg: dict, master, cache):
    """The validation segments' features, computed once (decode once, every feature) and kept."""
    from .data import segment_dataset
    from .pipeline import consume

    cols = val_columns(features)
    parts = {c: [] for c in cols}
    ds = segment_dataset(segments, features, index, vcfg, master, cache)
    for b, _ in consume(ds, 64, cols):
        for c in cols:
            parts[c].append(b[c])
    return in_val_order({c: np.concatenate(v) for c, v in parts.items()})


def val_columns(features: list[str]) -> list[str]:
    """The columns the validation features keep: every feature, and which segment of which video."""
    return [*features, "video", "label", "segment"]


def in_val_order(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The validation rows by video, then segment (however the pipeline delivered them)."""
    order = np.lexsort((data["segment"], data["video"]))
    return {c: v[order] for c, v in data.items()}


def score_states(states: dict[str, bytes], streams: dict, val: dict, num_classes: int, vcfg: dict):
    """Each stream's eval model from its state bytes, scored on the validation features:
    ``(models, scores, labels, losses, val metrics)`` (see ``val_scores``)."""
    from .aggregation import topk_accuracy
    from .model import load_model

    models = {s: load_model(states[s], spec["in_channels"], num_classes, vcfg["widths"], vcfg["dropout"])
              for s, spec in streams.items()}
    scores, labels, losses = val_scores(models, streams, val, num_classes, int(vcfg["val_segments"]))
    metrics = {f"val/{s}_loss": losses[s] for s in streams}
    metrics |= {f"val/{s}_top1": topk_accuracy(scores[s].mean(1), labels, 1) for s in streams}
    return models, scores, labels, losses, metrics


def val_scores(models: dict, streams: dict, val: dict, num_classes: int, per_video: int):
    """Validation probabilities per stream (V, K, C), labels (V,), mean loss per stream.

    Only videos with all ``per_video`` segments are kept, so a segment dropped by the
    decode stage (a file that broke) cannot misalign videos.
    """
    from .model import predict

    ids, counts = np.unique(val["video"], return_counts=True)
    rows = np.isin(val["video"], ids[counts == per_video])
    n = int((counts == per_video).sum())
    labels = val["label"][rows].reshape(n, per_video)[:, 0]
    scores, losses = {}, {}
    for stream, spec in streams.items():
        probs = predict(models[stream], val[spec["feature"]][rows])
        scores[stream] = probs.reshape(n, per_video, num_classes)
        losses[stream] = float(-np.log(probs[np.arange(len(probs)), val["label"][rows]] + 1e-9).mean())
    return scores, labels, losses


def fusion(scores: dict[str, np.ndarray], labels: np.ndarray, vcfg: dict, seed: int, ctx) -> tuple[dict, dict]:
    """The aggregation on the validation set: every fusion method's top-1, top-5 and log-loss in a
    table (``tables/aggregation.json`` and ``.md``), the winner tagged, and for each fitted method
    the stream it fell back to, if any (tag ``video.agg_<method>_fallback``: ``<stream>_only`` or
    ``none``); returns ``(aggregation.evaluate's result, the table's val/agg_* metrics)``."""
    from . import aggregation

    acfg = vcfg["aggregation"]
    agg = aggregation.evaluate(scores, labels, topk=int(acfg["topk"]), n_folds=int(acfg["folds"]), seed=seed,
                               attention_steps=int(acfg["attention_steps"]))
    ctx.log_dict({"table": agg["table"], "winner": agg["winner"], "fallbacks": agg["fallbacks"],
                  "linear_weights": agg["fitted"]["linear_weights"], "learned": agg["learned"]},
                 "tables/aggregation.json")
    ctx.log_text(markdown_table(agg["table"], agg["winner"]), "tables/aggregation.md")
    ctx.set_tags({"video.aggregation_winner": agg["winner"],
                  **{f"video.agg_{m}_fallback": f or "none" for m, f in agg["fallbacks"].items()}})
    final = {f"val/agg_{r['method']}_top1": r["top1"] for r in agg["table"]}
    final |= {f"val/agg_{r['method']}_top5": r["top5"] for r in agg["table"] if "top5" in r}
    final |= {f"val/agg_{r['method']}_log_loss": r["log_loss"] for r in agg["table"]}
    return agg, final


def markdown_table(table: list[dict], winner: str) -> str:
    has5 = any("top5" in r for r in table)
    lines = ["| method | top-1 |" + (" top-5 |" if has5 else "") + " log-loss |",
             "|---|---|" + ("---|" if has5 else "") + "---|"]
    for r in table:
        name = f"**{r['method']}** (winner)" if r["method"] == winner else r["method"]
        if r.get("fallback"):
            held = f"top-1 {r['fitted_top1']:.3f} held out" if "fitted_top1" in r else "nothing to hold out"
            name += f" (fell back to {r['fallback']}; fitted: {held})"
        lines.append(f"| {name} | {r['top1']:.3f} |" + (f" {r['top5']:.3f} |" if has5 else "")
                     + f" {r['log_loss']:.3f} |")
    lines.append("\nWinner: highest top-1, then top-5, then lowest log-loss, then the order above. "
                 "A fitted method that ranks below a stream alone on held-out videos falls back to it.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- highlights vs truth
def temporal_iou(a: tuple[int, int], b: tuple[int, int]) -> float:
    """IoU of two frame ranges [start, end)."""
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def union_iou(pred: list[tuple[int, int]], truth: list[tuple[int, int]], length: int) -> float:
    """IoU of the frame sets covered by two lists of segments (a video's highlight quality)."""
    p, t = np.zeros(length + 1, bool), np.zeros(length + 1, bool)
    for s, e in pred:
        p[s:e] = True
    for s, e in truth:
        t[s:e] = True
    union = (p | t).sum()
    return float((p & t).sum() / union) if union else 0.0


def average_precision(detections: list[tuple[str, int, int, float]], truth: dict[str, list[tuple[int, int]]],
                      threshold: float = 0.5) -> float:
    """AP of scored segments ``(video, start, end, score)`` against true segments per video:
    a detection is a hit when its tIoU with a not yet matched true segment reaches
    ``threshold`` (ActivityNet/THUMOS style, all-point interpolation)."""
    total = sum(len(v) for v in truth.values())
    if not total:
        return 0.0
    used = {v: [False] * len(segs) for v, segs in truth.items()}
    hits = []
    for video, s, e, _ in sorted(detections, key=lambda d: -d[3]):
        ious = [temporal_iou((s, e), t) for t in truth.get(video, [])]
        best = int(np.argmax(ious)) if ious else -1
        hit = best >= 0 and ious[best] >= threshold and not used[video][best]
        if hit:
            used[video][best] = True
        hits.append(hit)
    if not hits:
        return 0.0
    tp = np.cumsum(hits)
    precision = tp / np.arange(1, len(hits) + 1)
    recall = tp / total
    # all-point interpolation: precision made monotone, summed over recall steps
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.diff(np.concatenate([[0.0], recall]))
    return float((precision * steps).sum())


def highlight_metrics(predicted: dict[str, dict], truth: dict[str, list[tuple]], prefix: str) -> dict[str, float]:
    """``<prefix>/temporal_iou`` (mean over videos with truth), ``<prefix>/map_tiou_0.5``
    (mean over the true classes of per-class AP; a detection's class is its video's label,
    truth rows without a label count for every class: class-agnostic AP).

    ``predicted``: video -> {"label", "segments": [(start, end, score)], "frames"};
    ``truth``: video -> [(start, end, label or None)]."""
    videos = [v for v in truth if v in predicted]
    if not videos:
        return {}
    ious = [union_iou([(s, e) for s, e, _ in predicted[v]["segments"]], [(s, e) for s, e, _ in truth[v]],
                      max(predicted[v]["frames"], max(e for _, e, _ in truth[v]))) for v in videos]
    labels = sorted({lab for v in videos for *_, lab in truth[v] if lab})
    aps = []
    for lab in labels or [None]:
        gt = {v: [(s, e) for s, e, l in truth[v] if lab is None or l == lab] for v in videos}
        det = [(v, s, e, c) for v in videos for s, e, c in predicted[v]["segments"]
               if lab is None or predicted[v]["label"] == lab]
        if any(gt.values()):
            aps.append(average_precision(det, gt, 0.5))
    return {f"{prefix}/temporal_iou": float(np.mean(ious)), f"{prefix}/map_tiou_0.5": float(np.mean(aps)) if aps else 0.0,
            f"{prefix}/videos_with_truth": float(len(videos))}


def training_highlight_metrics(records: list[dict], count: int) -> dict[str, float]:
    """tIoU and mAP@0.5 of the synthetic untrimmed set's highlights during training
    (run.py step 3: each record's kept windows vs its known action frames)."""
    predicted, truth = {}, {}
    for r in records:
        start, end = r.get("action_frames") or [None, None]
        if start is None:
            continue
        kept = [w for w in r["windows"] if w["highlight"]]
        last = max((w["offset"] for w in r["windows"]), default=0) + count
        predicted[r["path"]] = {"label": r["label"], "frames": last,
                                "segments": merge_windows([w["offset"] for w in kept], count, last,
                                                          [w["confidence"] for w in kept])}
        truth[r["path"]] = [(int(start), int(end), r.get("truth"))]
    return highlight_metrics(predicted, truth, "infer")


def merge_windows(offsets: list[int], count: int, length: int, confidence: list[float]) -> list[tuple[int, int, float]]:
    """Kept windows [offset, offset + count) -> merged segments (start, end, mean confidence)."""
    segments: list[list] = []
    for o, c in sorted(zip(offsets, confidence)):
        start, end = int(o), min(int(o) + count, length)
        if segments and start <= segments[-1][1]:
            segments[-1][1] = max(segments[-1][1], end)
            segments[-1][2].append(float(c))
        else:
            segments.append([start, end, [float(c)]])
    return [(s, e, float(np.mean(c))) for s, e, c in segments]
