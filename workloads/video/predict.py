"""mode=predict for video, and the MLflow Model a train run logs.

The model is a ``pyfunc`` with this module as its ``loader_module``, holding everything a clip
goes through after training: the preprocessing (frame size, clip length, the stream features
and their extractor options), both streams' CNNs (``<stream>.pt``, weights-only state dicts),
the fusion method chosen on validation and its fitted weights (linear weights in
``video.json``, the attention module's state dict in ``attention.pt``) and the highlight
settings.  No pickle.  Its input is clips (N, T, H, W, 3) uint8 RGB of any size and length
(T >= 1; shorter clips loop), its output the fused class probabilities (N, K).

Prediction over video files: each video is decoded once, cut into sliding windows, every
window scored by both streams; highlight detection keeps the windows that move and that the
model is sure of (inference.py), and the kept windows are fused into the video's class and
confidence.  The kept windows, merged, are the video's highlight segments (frames).  With a
ground-truth CSV (``segments.csv`` in the input folder, columns
``video,start_frame,end_frame[,label]``; docs/models.md), the temporal IoU of each
video's highlights with its true segments and the mAP at tIoU 0.5 are reported.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from .evaluate import highlight_metrics, merge_windows

SETTINGS_FILE, ATTENTION_FILE = "video.json", "attention.pt"
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ogv")
TRUTH_FILE = "segments.csv"
MAX_FRAMES_IN_MEMORY = 512   # video.inference.max_frames_in_memory's default: decoded frames predict holds per video


class VideoModel:
    """The pyfunc model: clips -> fused probabilities, and whole videos -> label + highlights."""

    def __init__(self, settings: dict, states: dict, attention_state: dict | None):
        import torch

        from .aggregation import AttentionPool
        from .extractors import build_extractor, load_modules
        from .model import build_stream_model

        load_modules(settings.get("extractor_modules") or [])
        self.s = settings
        self.classes = settings["classes"]
        self.streams = settings["streams"]
        self.models = {}
        for name, spec in self.streams.items():
            model = build_stream_model(spec["in_channels"], len(self.classes), settings["widths"], settings["dropout"])
            model.load_state_dict(states[name])
            self.models[name] = model.eval()
        stack = int(settings["stack"])
        self.extractors = {f: build_extractor(f, stack=stack, **(settings["extractor_options"].get(f) or {}))
                           for f in {spec["feature"] for spec in self.streams.values()}}
        self.count = max(e.frames_needed(stack) for e in self.extractors.values())
        self.fitted = {"linear_weights": settings.get("linear_weights") or {}}
        if attention_state is not None:
            pool = AttentionPool(hidden=int(settings["attention_hidden"]))
            first = attention_state["0.weight"]
            pool.net = torch.nn.Sequential(torch.nn.Linear(first.shape[1], first.shape[0]), torch.nn.Tanh(),
                                           torch.nn.Linear(first.shape[0], 1))
            pool.net.load_state_dict(attention_state)
            self.fitted["attention"] = pool

    # -- clips --------------------------------------------------------------------------------
    def _resize(self, frames: np.ndarray) -> np.ndarray:
        import cv2

        size = int(self.s["size"])
        if frames.shape[1] == frames.shape[2] == size:
            return frames
        return np.stack([cv2.resize(f, (size, size), interpolation=cv2.INTER_AREA) for f in frames])

    def _clip(self, frames: np.ndarray, offset: int) -> np.ndarray:
        from .decoder import wanted_indices

        return frames[wanted_indices(offset, self.count, len(frames), self.s["short_rule"])]

    def window_scores(self, clips: list[np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per stream (W, K) probabilities and per feature (W, C, H, W) features of clips of
        ``count`` frames at the model's size."""
        from .extractors import extract_many
        from .model import predict

        # overlapping windows share frame pairs: extract_many computes each pair's flow once
        feats = {f: extract_many(ext, clips) for f, ext in self.extractors.items()}
        scores = {name: predict(self.models[name], feats[spec["feature"]]) for name, spec in self.streams.items()}
        return scores, feats

    def fuse(self, scores: dict[str, np.ndarray]) -> np.ndarray:
        """(V, K, C) per stream -> (V, C) with the method chosen on validation."""
        from .aggregation import fuse

        return fuse(self.s["method"], scores, self.fitted, topk=int(self.s["topk"]))

    def predict(self, model_input, params=None) -> np.ndarray:
        x = np.asarray(model_input)
        if x.ndim == 4:
            x = x[None]
        if x.ndim != 5 or x.shape[-1] != 3 or x.dtype != np.uint8:
            raise ValueError(f"clips (N, T, H, W, 3) uint8 RGB, got {x.dtype} {x.shape}")
        clips = [self._clip(self._resize(clip), max(0, (len(clip) - self.count) // 2)) for clip in x]
        scores, _ = self.window_scores(clips)
        return self.fuse({s: v[:, None] for s, v in scores.items()}).astype(np.float32)

    # -- whole videos ---------------------------------------------------------------------------
    def classify_video(self, frames: np.ndarray) -> dict:
        """Every frame of one video (T, H, W, 3) -> label, confidence, highlight segments."""
        from .inference import window_offsets

        frames = self._resize(frames)
        offsets = window_offsets(len(frames), self.count, int(self.s["window_stride"]))
        scores, motion = self._score_windows([self._clip(frames, o) for o in offsets])
        return self._verdict(offsets, scores, motion, len(frames))

    def classify_frames(self, frames, length: int, max_frames: int) -> dict:
        """One video's frames streamed in presentation order (``length`` of them, an iterable of
        (H, W, 3)) -> what ``classify_video`` gives, holding at most ``max_frames`` decoded frames at
        once (``video.inference.max_frames_in_memory``): the windows are scored a batch at a time
        and each frame is let go once no window still to score needs it. Memory is independent of
        the video's length. ``self.peak_frames`` says how many were held at most."""
        from .inference import window_offsets

        count, stride = self.count, int(self.s["window_stride"])
        if length <= max(max_frames, count):   # short enough to hold whole (and the short-video rule)
            held = self._resize(np.stack(list(frames)))
            self.peak_frames = len(held)
            return self.classify_video(held)
        offsets = window_offsets(length, count, stride)
        per_batch = max(1, (max_frames - count) // stride + 1)   # windows whose frames fit max_frames
        held: list[np.ndarray] = []   # held[j] is frame first + j
        first, todo, seen = 0, 0, 0
        parts: list[tuple[dict, np.ndarray]] = []
        self.peak_frames = 0

        def score(upto: int) -> None:
            nonlocal first, todo, held
            batch = offsets[todo:upto]
            parts.append(self._score_windows([np.stack(held[o - first:o - first + count]) for o in batch]))
            todo = upto
            keep_from = offsets[todo] if todo < len(offsets) else first + len(held)
            held = held[keep_from - first:]
            first = keep_from

        for i, frame in enumerate(frames):
            seen = i + 1
            if i < first:   # between windows (a stride longer than a window): not needed
                continue
            held.append(self._resize(frame[None])[0])
            self.peak_frames = max(self.peak_frames, len(held))
            ready = todo
            while ready < len(offsets) and ready - todo < per_batch and offsets[ready] + count <= i + 1:
                ready += 1
            if ready - todo == per_batch or (ready == len(offsets) and ready > todo):
                score(ready)
        if todo < len(offsets):
            raise ValueError(f"truncated: decoded {seen} of {length} frames")
        scores = {s: np.concatenate([p[0][s] for p in parts]) for s in parts[0][0]}
        return self._verdict(offsets, scores, np.concatenate([p[1] for p in parts]), length)

    def _score_windows(self, clips: list[np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Clips -> per stream (W, K) probabilities and the windows' motion energy (W,)."""
        from .inference import motion_energy

        scores, feats = self.window_scores(clips)
        temporal = next((spec["feature"] for spec in self.streams.values() if spec["feature"] != "rgb"), None)
        motion = motion_energy(temporal, feats[temporal], (self.s["extractor_options"].get(temporal) or {})
                               | {"stack": int(self.s["stack"])}) if temporal else np.full(len(clips), np.inf)
        return scores, motion

    def _verdict(self, offsets: list[int], scores: dict[str, np.ndarray], motion: np.ndarray, length: int) -> dict:
        from .inference import classify_untrimmed

        out = classify_untrimmed(scores, motion, self.s["method"], self.fitted, self.s["inference"], int(self.s["topk"]))
        segments = merge_windows([o for o, k in zip(offsets, out["keep"]) if k], self.count, length,
                                 [c for c, k in zip(out["confidence"], out["keep"]) if k])
        return {"label": self.classes[out["label"]], "confidence": float(out["fused"][out["label"]]),
                "frames": length, "windows": len(offsets), "kept": int(out["keep"].sum()), "segments": segments}


def _load_pyfunc(data_path: str) -> VideoModel:
    """MLflow's entry point (loader_module): rebuild both streams and the fusion from plain files."""
    import torch

    folder = Path(data_path)
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    states = {s: torch.load(folder / f"{s}.pt", map_location="cpu", weights_only=True) for s in settings["streams"]}
    attention = folder / ATTENTION_FILE
    attn = torch.load(attention, map_location="cpu", weights_only=True) if attention.is_file() else None
    return VideoModel(settings, states, attn)


def log_model(ctx, models: dict, streams: dict, classes: list[str], vcfg: dict, winner: str, fitted: dict) -> Path:
    """At the end of training: both streams, the fusion and the preprocessing as an MLflow
    pyfunc Model (artifact ``model``)."""
    import tempfile

    import torch

    from orchard.api import save_model, save_pyfunc

    method = winner if vcfg["inference"]["method"] == "winner" else vcfg["inference"]["method"]
    attention = fitted.get("attention")
    settings = {"classes": list(classes), "streams": {s: {"feature": spec["feature"], "in_channels": int(spec["in_channels"])}
                                                     for s, spec in streams.items()},
                "widths": [int(w) for w in vcfg["widths"]], "dropout": float(vcfg["dropout"]),
                "size": int(vcfg["size"]), "stack": int(vcfg["stack"]), "short_rule": vcfg["short_rule"],
                "extractor_options": vcfg["extractor_options"], "extractor_modules": list(vcfg.get("extractor_modules") or []),
                "method": method, "topk": int(vcfg["aggregation"]["topk"]),
                "linear_weights": {k: float(v) for k, v in (fitted.get("linear_weights") or {}).items()},
                "attention_hidden": int(getattr(attention, "hidden", 16)),
                "window_stride": int(vcfg["inference"]["window_stride"]), "inference": dict(vcfg["inference"])}

    def write(path: Path, metadata: dict) -> None:
        with tempfile.TemporaryDirectory(prefix="orchard-video-") as tmp:
            folder = Path(tmp) / "video"
            folder.mkdir()
            (folder / SETTINGS_FILE).write_text(json.dumps(settings))
            for s, model in models.items():
                torch.save(model.state_dict(), folder / f"{s}.pt")
            if attention is not None and getattr(attention, "net", None) is not None:
                torch.save(attention.net.state_dict(), folder / ATTENTION_FILE)
            model = _load_pyfunc(str(folder))
            size = int(vcfg["size"])
            example = np.random.default_rng(0).integers(0, 256, (1, model.count, size, size, 3), dtype=np.uint8)
            save_pyfunc(path, {**metadata, "classes": ",".join(classes), "method": method}, "workloads.video.predict",
                        folder, example, model.predict(example), free_inputs=(0, 1, 2, 3), free_outputs=(0,))

    return save_model(ctx, "video", write)


def read_truth(path: Path) -> dict[str, list[tuple]]:
    """``video,start_frame,end_frame[,label]`` -> video file name -> [(start, end, label)]."""
    from orchard.api import ConfigError

    out: dict[str, list[tuple]] = {}
    try:
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                out.setdefault(Path(row["video"]).name, []).append(
                    (int(row["start_frame"]), int(row["end_frame"]), (row.get("label") or None)))
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError("input", f"{path.name}: a CSV with columns video,start_frame,end_frame[,label] ({exc})") from None
    return out


# --------------------------------------------------------------------------- files
class Predictor:
    """Ray Data actor: holds both streams and the fusion, classifies a batch of video files."""

    def __init__(self, model_dir: str, out_dir: str, settings: str, max_frames: int = MAX_FRAMES_IN_MEMORY):
        import torch

        torch.set_num_threads(1)
        self.model = _load_pyfunc(str((Path(model_dir) / settings).parent))  # the file predict checked
        self.out = Path(out_dir)
        self.max_frames = int(max_frames)

    def __call__(self, batch: dict) -> dict:
        from orchard.api import kind_of

        from .decoder import BadVideo, build_decoder

        dec = build_decoder("pyav", size=int(self.model.s["size"]), short_rule=self.model.s["short_rule"])
        cols = {k: [] for k in ("path", "error", "kind", "label", "confidence", "frames", "windows", "kept", "segments")}
        for path in batch["path"]:
            path = str(path)
            try:
                length = len(dec.index(path))  # a truncated or non-video file is refused here, with its kind
                out = self.model.classify_frames(dec.iter_frames(path), length, self.max_frames)
                segs = json.dumps([[s, e, round(c, 4)] for s, e, c in out["segments"]])
                values = ("", "", out["label"], out["confidence"], out["frames"], out["windows"], out["kept"], segs)
            except (BadVideo, Exception) as exc:  # one bad file never stops the run: skipped and counted by kind
                values = (str(exc).splitlines()[0][:200] or type(exc).__name__, kind_of(exc), "", 0.0, 0, 0, 0, "[]")
            cols["path"].append(path)
            for key, value in zip(("error", "kind", "label", "confidence", "frames", "windows", "kept", "segments"), values):
                cols[key].append(value)
        return {k: np.asarray(v) for k, v in cols.items()}


def predict(cfg: dict, ctx, out: Path) -> dict[str, float]:
    """``mode=predict``: classify every video of ``input``; highlight segments; tIoU and mAP@0.5
    against ``segments.csv`` when the input folder has one. ``out`` is the predictions folder the
    core opened (orchard/config/registry.py ``entry``: renamed into place once written whole)."""
    from orchard.api import batch_predict, skipped

    v = cfg["video"]

    def plan(meta: dict, source: Path) -> batch_predict.Plan:
        videos = [p for p in skipped.listed_inputs(source, ()) if p.name != TRUTH_FILE]
        held = int(v["inference"].get("max_frames_in_memory") or MAX_FRAMES_IN_MEMORY)
        return batch_predict.Plan(SETTINGS_FILE, Predictor, videos,
                                  ["path", "label", "confidence", "frames", "kept", "segments"], "videos",
                                  args={"max_frames": held}, desc="classifying", batch_size=2,
                                  trusted=("extractor_modules", v.get("extractor_modules"), "video.extractor_modules"))

    done = batch_predict.predict_inputs(cfg, ctx, out, "video", plan)
    metrics = dict(done.metrics)
    metrics["predict/frames_per_s"] = sum(int(r["frames"]) for r in done.good) / max(done.elapsed_s, 1e-9)
    source = done.source
    truth_path = source / TRUTH_FILE if source.is_dir() else source.with_name(TRUTH_FILE)
    if truth_path.is_file():
        truth = read_truth(truth_path)
        predicted = {Path(r["path"]).name: {"label": r["label"], "frames": int(r["frames"]),
                                            "segments": [tuple(s) for s in json.loads(r["segments"])]} for r in done.good}
        found = highlight_metrics(predicted, truth, "predict")
        metrics.update(found)
        batch_predict.log_outputs(ctx, out)
    return metrics