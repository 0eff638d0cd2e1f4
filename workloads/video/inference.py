"""Inference on untrimmed video: sliding windows, highlight detection, then aggregation.

The notes: untrimmed videos have "a large percentage of unmeaning video segments"
that confuse the prediction, so a highlight-detection phase drops them before the
result is aggregated. Both gates are relative to the video's own windows, because
absolute levels move with the video and with the trained model (an absolute
motion floor of 0.25 px/frame dropped every window of slow rotations and zooms,
whose action windows reach 0.14-0.23 px/frame over a 0.11 background; an absolute
confidence floor moved with each run's calibration). A window is a highlight when
- its motion energy (mean flow magnitude in pixels/frame, or mean absolute frame
  difference for a framediff stream) reaches ``floor + motion_ratio * (peak - floor)``,
  floor and peak being the video's least and most moving windows; a video whose
  peak - floor gap is under ``min_motion_contrast`` has no static background to drop,
  and every window passes this gate; and
- the fused confidence (max probability) reaches ``confidence_ratio`` times the
  best confidence among the windows that passed the motion gate.
The kept windows are then fused with the aggregation method chosen on the
validation set, treating each window as a segment.
"""
from __future__ import annotations

import time

import numpy as np

from . import aggregation
from .extractors import build_extractor


def window_offsets(length: int, count: int, stride: int) -> list[int]:
    """Start frames of the sliding windows (the last window ends at the video's end)."""
    last = max(0, length - count)
    offsets = list(range(0, last + 1, stride))
    if offsets[-1] != last:
        offsets.append(last)
    return offsets


def motion_energy(feature: str, x: np.ndarray, options: dict) -> np.ndarray:
    """Per-window motion energy (N,) from a temporal feature batch (N, C, H, W) uint8."""
    if feature == "flow":
        ext = build_extractor("flow", **options)
        flow = ext.dequantize(x)                       # (N, 2L, H, W) pixels
        return np.sqrt(flow[:, 0::2] ** 2 + flow[:, 1::2] ** 2).mean(axis=(1, 2, 3))
    if feature == "framediff":
        return np.abs(x.astype(np.float32) * 2 - 255).mean(axis=(1, 2, 3))
    return np.full(len(x), np.inf)  # no motion cue: the confidence gate alone decides


def highlight_mask(confidence: np.ndarray, motion: np.ndarray, motion_ratio: float,
                   confidence_ratio: float, min_motion_contrast: float) -> np.ndarray:
    """Boolean mask (W,) of a video's highlight windows, from its windows' own levels.

    ``confidence`` (W,) fused max probabilities; ``motion`` (W,) motion energy
    (inf where the streams carry no motion cue). Never empty: the most moving
    window always passes the motion gate and the best of those the confidence gate.
    """
    keep = np.ones(len(confidence), bool)
    finite = np.isfinite(motion)
    if finite.all() and len(motion):
        floor, peak = float(motion.min()), float(motion.max())
        if peak - floor >= min_motion_contrast:
            keep = motion >= floor + motion_ratio * (peak - floor)
    best = float(confidence[keep].max())
    return keep & (confidence >= confidence_ratio * best)


def classify_untrimmed(window_scores: dict[str, np.ndarray], motion: np.ndarray, method: str,
                       fitted: dict, icfg: dict, topk: int) -> dict:
    """One video: per-window stream scores (W, C) -> label, kept windows, fused scores."""
    avg = np.mean([window_scores[s] for s in sorted(window_scores)], axis=0)   # (W, C)
    confidence = avg.max(axis=1)
    keep = highlight_mask(confidence, motion, float(icfg["motion_ratio"]), float(icfg["confidence_ratio"]),
                          float(icfg["min_motion_contrast"]))
    as_segments = {s: v[keep][None] for s, v in window_scores.items()}         # (1, K, C)
    all_segments = {s: v[None] for s, v in window_scores.items()}
    fused = aggregation.fuse(method, as_segments, fitted, topk=topk)[0]
    fused_all = aggregation.fuse(method, all_segments, fitted, topk=topk)[0]
    return {"label": int(np.argmax(fused)), "label_all_windows": int(np.argmax(fused_all)),
            "keep": keep, "confidence": confidence, "fused": fused}


def inference_segments(videos: list[dict], count: int, stride: int, decoder: str, first_id: int = 0) -> list[dict]:
    """The sliding windows' segment seeds over ``videos`` (pipeline video ids from ``first_id``); a
    video's frame index (``pts``), ``length`` and content ``digest`` (the decode cache's key) are
    read here where not given, once: the pipeline that decodes the windows takes them from there."""
    from .decoder import build_decoder
    from .frame_index import file_digest

    dec = build_decoder(decoder)
    segments = []
    for v, video in enumerate(videos):
        if "pts" not in video:
            video["pts"] = dec.index(video["path"])
        video.setdefault("length", len(video["pts"]))
        if "digest" not in video:
            video["digest"] = file_digest(video["path"])
        for k, off in enumerate(window_offsets(video["length"], count, stride)):
            segments.append({"video": first_id + v, "label": -1, "offset": off, "count": count, "segment": k})
    return segments


def inference_columns(features: list[str]) -> list[str]:
    """What inference keeps of a window's row: every feature, and where the window is."""
    return [*features, "video", "segment", "offset"]


def run_inference(videos: list[dict], classes: list[str], models: dict, streams: dict, vcfg: dict,
                  method: str, fitted: dict, master, cache, decoded: dict | None = None, first_id: int = 0,
                  decoded_s: float = 0.0) -> tuple[dict[str, float], list[dict]]:
    """Classify every untrimmed video; returns (metrics, per-video records).

    ``videos``: ``[{"path", "label" (class name or None), "length", ...}]``;
    ``models``: stream -> eval-mode model; ``streams``: stream -> {"feature", ...}. ``decoded``:
    the windows' rows (``inference_columns``) as the training pipeline delivered them after its last
    epoch, the videos numbered from ``first_id``, in ``decoded_s`` seconds; None: a pipeline of their own.
    """
    from .pipeline import build_dataset, frame_count
    from .model import predict

    features = sorted({s["feature"] for s in streams.values()})
    count = frame_count(features, int(vcfg["stack"]), vcfg.get("extractor_modules") or ())
    icfg = vcfg["inference"]
    segments = inference_segments(videos, count, int(icfg["window_stride"]), vcfg["decoder"])
    t0 = time.perf_counter()
    if decoded is None:
        paths, lengths = [v["path"] for v in videos], [v["length"] for v in videos]
        ds = build_dataset(segments, features, paths, lengths, vcfg, master, cache, pts=[v["pts"] for v in videos],
                           digests=[v["digest"] for v in videos])
        feats, meta = _collect_all(ds, features)  # one pass carries every feature
    else:
        feats = {f: decoded[f] for f in features}
        meta = {"video": decoded["video"] - first_id, "segment": decoded["segment"], "offset": decoded["offset"]}
    scores = {s: predict(models[s], feats[spec["feature"]]) for s, spec in streams.items()}
    temporal = next((spec["feature"] for spec in streams.values() if spec["feature"] != "rgb"), None)
    motion = motion_energy(temporal, feats[temporal], (vcfg["extractor_options"].get(temporal) or {})
                           | {"stack": int(vcfg["stack"])}) if temporal else np.full(len(meta["video"]), np.inf)
    elapsed = decoded_s + time.perf_counter() - t0   # the windows through the pipeline, then classified
    records, correct, correct_all, kept = [], 0, 0, 0
    for v, video in enumerate(videos):
        rows = np.flatnonzero(meta["video"] == v)
        rows = rows[np.argsort(meta["segment"][rows])]
        out = classify_untrimmed({s: sc[rows] for s, sc in scores.items()}, motion[rows], method, fitted,
                                 icfg, int(vcfg["aggregation"]["topk"]))
        truth = classes.index(video["label"]) if video.get("label") in classes else None
        correct += int(truth is not None and out["label"] == truth)
        correct_all += int(truth is not None and out["label_all_windows"] == truth)
        kept += int(out["keep"].sum())
        offsets = meta["offset"][rows]
        records.append({
            "path": video["path"], "label": classes[out["label"]], "truth": video.get("label"),
            "action_frames": [video.get("action_start"), video.get("action_end")],
            "windows": [{"offset": int(o), "highlight": bool(h), "confidence": float(c), "motion": float(m),
                         **{f"{s}_scores": scores[s][r].round(4).tolist() for s in scores}}
                        for o, h, c, m, r in zip(offsets, out["keep"], out["confidence"], motion[rows], rows)],
        })
    labelled = sum(v.get("label") in classes for v in videos)
    metrics = {"infer/windows_per_s": len(segments) / max(elapsed, 1e-9),
               "infer/kept_window_fraction": kept / max(len(segments), 1)}
    if labelled:
        metrics["infer/top1"] = correct / labelled
        metrics["infer/top1_all_windows"] = correct_all / labelled
    return metrics, records


def _collect_all(ds, features: list[str]):
    from .pipeline import consume

    cols = inference_columns(features)
    parts = {c: [] for c in cols}
    for b, _ in consume(ds, 64, cols):
        for c in cols:
            parts[c].append(b[c])
    feats = {f: np.concatenate(parts[f]) for f in features}
    meta = {c: np.concatenate(parts[c]) for c in ("video", "segment", "offset")}
    return feats, meta
