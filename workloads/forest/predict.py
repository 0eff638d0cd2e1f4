"""mode=predict for forest, and the MLflow Model a train run logs.

The model is a ``pyfunc`` with this module as its ``loader_module``: the packed forest (every
tree's offsets, thresholds, children and leaf distributions; ``model.pack_forest``) in
``forest.npz`` and the settings (``background_mm``, the label palette) in ``forest.json``; no
pickle.  Its input is depth images (N, H, W) uint16 millimetres, its output body-part labels
(N, H, W) uint8 (0..30 parts, 31 background).  As in the Kinect pipeline the classifier labels
the person's pixels: every pixel with a depth reading (> 0) is labelled, so give depth images
whose background is 0 (the player segmented), as the training pairs are.

Prediction over files: every ``<name>.png`` that is 16-bit single-channel depth (``*_depth.png``
of a training pair too) -> ``predictions/labels/<stem>_labels.png`` coloured with the training
palette; when a ``<stem>_labels.png`` sits beside a ``<stem>_depth.png``, its body pixels are
scored: per-pixel, per-class and mean per-class accuracy over all such images.
"""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

FOREST_FILE, SETTINGS_FILE = "forest.npz", "forest.json"


class ForestModel:
    """The pyfunc model: ``predict(depths)`` -> labels; no Ray."""

    def __init__(self, packed: dict, background_mm: float, palette: np.ndarray):
        self.packed, self.background_mm, self.palette = packed, float(background_mm), palette

    def labels(self, depth: np.ndarray) -> np.ndarray:
        """(H, W) uint16 mm -> (H, W) uint8 labels, BACKGROUND where there is no reading."""
        from .model import predict_images

        depths = np.ascontiguousarray(depth[None].astype(np.uint16))
        out, _ = predict_images(self.packed, depths, depths > 0, self.background_mm)
        return out[0]

    def predict(self, model_input, params=None) -> np.ndarray:
        x = np.asarray(model_input)
        if x.ndim == 2:
            x = x[None]
        if x.ndim != 3:
            raise ValueError(f"depth images (N, H, W) uint16 mm, got shape {x.shape}")
        return np.stack([self.labels(d) for d in x])


def _load_pyfunc(data_path: str) -> ForestModel:
    """MLflow's entry point (loader_module): rebuild the model from its plain files."""
    folder = Path(data_path)
    with np.load(folder / FOREST_FILE, allow_pickle=False) as data:
        packed = {k: np.ascontiguousarray(data[k]) for k in data.files}
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    return ForestModel(packed, settings["background_mm"], np.asarray(settings["palette"], np.uint8))


def example_depth(height: int = 48, width: int = 32) -> np.ndarray:
    """A tiny depth image (1, H, W) uint16: an ellipse 2 m away, 0 around it (the input example)."""
    yy, xx = np.mgrid[:height, :width]
    inside = ((yy - height / 2) / (height * 0.4)) ** 2 + ((xx - width / 2) / (width * 0.3)) ** 2 <= 1
    return np.where(inside, 2000, 0).astype(np.uint16)[None]


def log_model(ctx, trees: list, class_weights: list, forest_cfg: dict, palette: np.ndarray) -> Path:
    """At the end of training: the forest as an MLflow pyfunc Model (artifact ``model``)."""
    import tempfile

    from orchard.api import save_model, save_pyfunc
    from .model import pack_forest

    packed = pack_forest(trees, class_weights)
    model = ForestModel(packed, forest_cfg["background_mm"], palette)

    def write(path: Path, metadata: dict) -> None:
        with tempfile.TemporaryDirectory(prefix="orchard-forest-") as tmp:
            data = Path(tmp) / "forest"
            data.mkdir()
            np.savez(data / FOREST_FILE, **packed)
            (data / SETTINGS_FILE).write_text(json.dumps({"background_mm": float(forest_cfg["background_mm"]),
                                                           "palette": palette.tolist()}))
            example = example_depth()
            out = model.predict(example)
            save_pyfunc(path, {**metadata, "trees": len(trees)}, "workloads.forest.predict", data, example, out,
                        free_inputs=(0, 1, 2), free_outputs=(0, 1, 2))   # images of any size and count

    return save_model(ctx, "forest", write)


# --------------------------------------------------------------------------- files
def read_depth(path: Path) -> np.ndarray:
    """(H, W) uint16 mm; ValueError (the reason) for anything else."""
    depth = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if depth is None:
        raise ValueError("not a readable PNG (corrupt or not an image)")
    if depth.dtype != np.uint16 or depth.ndim != 2:
        channels = 1 if depth.ndim == 2 else depth.shape[2]
        raise ValueError(f"{depth.dtype} with {channels} channel(s); depth is 16-bit single-channel millimetres")
    return depth


def truth_file(path: Path) -> Path | None:
    """``<stem>_labels.png`` beside ``<stem>_depth.png``, if any."""
    if path.name.endswith("_depth.png"):
        labels = path.with_name(path.name[:-len("_depth.png")] + "_labels.png")
        return labels if labels.is_file() else None
    return None


class Predictor:
    """Ray Data actor: holds the forest, labels a batch of depth PNGs, writes label PNGs."""

    def __init__(self, model_dir: str, out_dir: str, settings: str):
        from .body_parts import NUM_PARTS

        self.model = _load_pyfunc(str((Path(model_dir) / settings).parent))  # the file predict found
        self.out, self.parts = Path(out_dir), NUM_PARTS

    def __call__(self, batch: dict) -> dict:
        from .depth_png import read_pair
        from .evaluate import confusion_matrix
        from .body_parts import BACKGROUND

        from orchard.api import kind_of

        n_conf = self.parts * self.parts
        cols = {"path": [], "error": [], "kind": [], "width": [], "height": [], "labelled_pixels": [], "scored": [],
                "confusion": []}
        for path in batch["path"]:
            path = Path(str(path))
            confusion, scored = np.zeros(n_conf, np.int64), False
            try:
                depth = read_depth(path)
                labels = self.model.labels(depth)
                stem = path.name[:-len("_depth.png")] if path.name.endswith("_depth.png") else path.stem
                rgb = self.model.palette[labels]
                cv2.imwrite(str(self.out / "labels" / f"{stem}_labels.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
                truth_path = truth_file(path)
                if truth_path is not None:
                    try:
                        _, truth = read_pair(path.with_name(stem), self.model.palette)
                        body = (truth != BACKGROUND) & (depth > 0)
                        confusion = confusion_matrix(np.where(body, truth, BACKGROUND), labels).ravel()
                        scored = True
                    except (OSError, ValueError) as exc:  # labels unusable: the prediction stands, unscored
                        print(f"forest: {truth_path.name} not scored: {str(exc).splitlines()[0][:160]}", flush=True)
                values = ("", "", depth.shape[1], depth.shape[0], int((labels != BACKGROUND).sum()))
            except Exception as exc:  # one bad file never stops the run: skipped and counted by kind
                values = (str(exc).splitlines()[0][:200] or type(exc).__name__, kind_of(exc), 0, 0, 0)
            cols["path"].append(str(path))
            for key, value in zip(("error", "kind", "width", "height", "labelled_pixels"), values):
                cols[key].append(value)
            cols["scored"].append(scored)
            cols["confusion"].append(confusion)
        return {k: np.asarray(v) for k, v in cols.items()}


def depth_files(folder) -> list[Path]:
    """PNGs of ``input`` that are not label images of a pair."""
    from orchard.api import listed_inputs

    # links to nothing and unreadable files are listed too: predict skips and counts them
    return [p for p in listed_inputs(folder, (".png",)) if not p.name.endswith("_labels.png")]


def predict(cfg: dict, ctx, out: Path) -> dict[str, float]:
    """``mode=predict``: label every depth PNG of ``input`` into ``out`` (the predictions folder
    the core opened: orchard/config/registry.py ``entry``); accuracy where ground-truth labels sit beside."""
    from orchard.api import batch_predict

    from .body_parts import NUM_PARTS, PART_NAMES
    from .evaluate import accuracy_metrics

    def plan(meta: dict, source: Path) -> batch_predict.Plan:
        return batch_predict.Plan(SETTINGS_FILE, Predictor, depth_files(source),
                                  ["path", "width", "height", "labelled_pixels", "scored"], "images", subdir="labels",
                                  companions=lambda p: [t for t in [truth_file(p)] if t is not None], desc="labelling")

    done = batch_predict.predict_inputs(cfg, ctx, out, "forest", plan)
    metrics = dict(done.metrics)
    metrics["predict/pixels_per_s"] = sum(int(r["width"]) * int(r["height"]) for r in done.good) / max(done.elapsed_s, 1e-9)
    scored = [r for r in done.good if r["scored"]]
    if scored:
        confusion = np.sum([np.asarray(r["confusion"]).reshape(NUM_PARTS, NUM_PARTS) for r in scored], axis=0)
        acc = accuracy_metrics(confusion)
        per_class = {f"predict/class_acc/{PART_NAMES[c]}": v for c, v in acc["class_accuracy"].items()}
        ctx.log_metrics(per_class)
        ctx.log_dict({"parts": list(PART_NAMES), "confusion": confusion.tolist(),
                      "class_accuracy": {PART_NAMES[c]: v for c, v in acc["class_accuracy"].items()}},
                     "predictions/accuracy.json")
        metrics.update({"predict/scored_images": float(len(scored)), "predict/pixel_accuracy": acc["pixel_accuracy"],
                        "predict/mean_class_accuracy": acc["mean_class_accuracy"]})
    return metrics
