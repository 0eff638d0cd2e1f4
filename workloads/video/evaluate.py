"""Evaluation of the two streams and their fusion, against the truth and chance.

Every epoch, each stream's state is scored on the validation segments' features (computed once:
``val_features``); after training, the fusion methods (aggregation.py) are compared on those
scores in a table, its winner tagged. Inference on untrimmed video (sliding windows, highlight
detection: inference.py) is scored by run.py with the winning fusion; the baseline is chance
(``val/chance_top1``, in run.py's final metrics).
"""
from __future__ import annotations

import numpy as np


def val_features(segments: list[dict], features: list[str], index, vcfg: dict, master, cache):
    """The validation segments' features, computed once (decode once, every feature) and kept."""
    from .data import segment_dataset
    from .pipeline import consume

    cols = [*features, "video", "label", "segment"]
    parts = {c: [] for c in cols}
    ds = segment_dataset(segments, features, index, vcfg, master, cache)
    for b, _ in consume(ds, 64, cols):
        for c in cols:
            parts[c].append(b[c])
    data = {c: np.concatenate(v) for c, v in parts.items()}
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
    table (``tables/aggregation.json`` and ``.md``), the winner tagged; returns
    ``(aggregation.evaluate's result, the table's val/agg_* metrics)``."""
    from . import aggregation

    acfg = vcfg["aggregation"]
    agg = aggregation.evaluate(scores, labels, topk=int(acfg["topk"]), n_folds=int(acfg["folds"]), seed=seed,
                               attention_steps=int(acfg["attention_steps"]))
    ctx.log_dict({"table": agg["table"], "winner": agg["winner"],
                  "linear_weights": agg["fitted"]["linear_weights"]}, "tables/aggregation.json")
    ctx.log_text(markdown_table(agg["table"], agg["winner"]), "tables/aggregation.md")
    ctx.set_tags({"video.aggregation_winner": agg["winner"]})
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
        lines.append(f"| {name} | {r['top1']:.3f} |" + (f" {r['top5']:.3f} |" if has5 else "")
                     + f" {r['log_loss']:.3f} |")
    lines.append("\nWinner: highest top-1, then top-5, then lowest log-loss, then the order above.")
    return "\n".join(lines) + "\n"
