"""mode=predict for flower, and the MLflow Model a train run logs.

The model: MLflow's PyTorch flavour, saved as a ``torch.export`` program (``pt2``: no pickle
of our classes), input tiles (N, 3, T, T) float32 in [0, 1] at the training tile size T,
output density maps (N, 1, T, T) x ``density_scale`` (MLmodel metadata); the weights also
travel as the state dict ``model.pt`` (``torch.load(weights_only=True)``), which predict uses.

Prediction: each image of any size is padded (by reflection) up to whole tiles, cut into tiles
of the training size, counted tile by tile (bounded memory, as in training), and the stitched
density map is cropped back to the image: the count is its sum. Writes predictions.csv
(image, width, height, count) and one density PNG per image (predictions/density/).
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .checkpoint import MODEL_FILE
from .data import DEFAULT_MAX_PIXELS, IMAGE_SUFFIXES, photo_size, PhotoError, read_rgb


BAND_BYTES = 64 * 2**20   # tiles of one band of tile rows held at once by count_image (64 MiB)


def count_image(model, rgb: np.ndarray, tile_size: int, scale: float, batch_size: int = 64,
                device=None, band_bytes: int = BAND_BYTES) -> np.ndarray:
    """Density map (H, W) in flowers per pixel for an RGB uint8 image (H, W, 3) of any size;
    its tiles are counted in batches of ``batch_size`` on ``device`` (default: the model's).

    The image is cut a band of tile rows at a time (at most ``band_bytes`` of tiles), so beyond
    the photo and its density map memory does not grow with the photo's size; each tile is
    counted on its own, so the map is the one the whole image cut at once gives."""
    import torch

    from .evaluate import predict_density

    height, width = rgb.shape[:2]
    rows, cols = -(-height // tile_size), -(-width // tile_size)
    # Reflection keeps field texture at the edge (black padding would look like shadow);
    # the padded area is cropped away before counting.
    mode = cv2.BORDER_REFLECT_101 if min(height, width) > 1 else cv2.BORDER_REPLICATE
    band_rows = max(1, band_bytes // max(1, cols * tile_size * tile_size * 3))
    density = np.empty((height, width), np.float32)
    for r0 in range(0, rows, band_rows):
        r1 = min(rows, r0 + band_rows)
        # the band's rows of the padded image: rows past the bottom edge reflected as the whole
        # image's padding reflects them
        wanted = [cv2.borderInterpolate(y, height, mode) for y in range(r0 * tile_size, r1 * tile_size)]
        band = cv2.copyMakeBorder(np.ascontiguousarray(rgb[wanted]), 0, 0, 0, cols * tile_size - width, mode)
        tiles = band.reshape(r1 - r0, tile_size, cols, tile_size, 3).swapaxes(1, 2).reshape(-1, tile_size, tile_size, 3)
        with torch.inference_mode():
            maps, _ = predict_density(model, tiles, scale, batch_size, device)
        stitched = maps.reshape(r1 - r0, cols, tile_size, tile_size).swapaxes(1, 2).reshape(
            (r1 - r0) * tile_size, cols * tile_size)
        top = r0 * tile_size
        density[top:min(height, r1 * tile_size)] = stitched[:min(height, r1 * tile_size) - top, :width]
    return density


def density_png(density: np.ndarray) -> np.ndarray:
    """A BGR colour image of a density map (jet colormap, max density = red)."""
    peak = float(density.max())
    unit = np.clip(density / peak, 0, 1) if peak > 0 else np.zeros_like(density)
    return cv2.applyColorMap((unit * 255).astype(np.uint8), cv2.COLORMAP_JET)


def read_image(path: Path, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """RGB uint8 (H, W, 3); PhotoError (its kind and reason) for a file that is not a colour
    image, or whose header says it is over ``max_pixels`` (``flower.max_image_pixels``: refused
    before a pixel is decoded, as training does)."""
    kind = "corrupt"
    try:
        photo_size(path, max_pixels)
    except PhotoError as exc:
        if exc.kind == "too_large":
            raise
        kind = exc.kind   # cv2 below may still read what PIL cannot; if not, this is why
    bgr = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if bgr is None:
        raise PhotoError(kind, "not a readable image (corrupt or not an image)")
    if bgr.dtype != np.uint8:
        raise PhotoError("not_8bit", f"{bgr.dtype} pixels; a field photograph is 8-bit")
    if bgr.ndim == 2 or bgr.shape[2] not in (3, 4):
        raise PhotoError("not_rgb", f"{1 if bgr.ndim == 2 else bgr.shape[2]} channel(s); a field photograph is RGB")
    return read_rgb(path)


# --------------------------------------------------------------------------- the MLflow Model
def log_model(ctx, model_file: Path) -> Path:
    """At the end of training: the trained model as an MLflow Model (PyTorch flavour), artifact
    ``model`` of the run and ``<run folder>/model``."""
    import torch

    from orchard.api import free_dims, pip_requirements, save_model
    from .checkpoint import load_model

    model, scale = load_model(model_file)
    tile = int(torch.load(model_file, map_location="cpu", weights_only=True).get("tile_size", 64))

    def write(path: Path, metadata: dict) -> None:
        import mlflow.pytorch
        from mlflow.models import infer_signature

        example = np.random.default_rng(0).random((2, 3, tile, tile), dtype=np.float32)
        with torch.inference_mode():
            out = model(torch.from_numpy(example)).numpy()
        mlflow.pytorch.save_model(model, str(path), serialization_format="pt2", input_example=example,
                                  signature=free_dims(infer_signature(example, out), [0], [0]),
                                  extra_files=[str(model_file)], pip_requirements=pip_requirements(),
                                  metadata={**metadata, "tile_size": tile, "density_scale": scale})

    return save_model(ctx, "flower", write)


class Predictor:
    """Ray Data actor: holds the model, counts a batch of image paths, writes density PNGs."""

    def __init__(self, model_dir: str, out_dir: str, weights: str, tile_size: int, batch_size: int = 64,
                 device: str = "auto", max_pixels: int | None = DEFAULT_MAX_PIXELS):
        import torch

        from .checkpoint import load_model

        torch.set_num_threads(1)
        # auto: a GPU if this actor was given one (Ray hides the GPUs from actors that hold none)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.model, self.scale = load_model(Path(model_dir) / weights, device)  # the one predict found
        self.tile, self.out, self.batch = int(tile_size), Path(out_dir), int(batch_size)
        self.max_pixels = max_pixels

    def __call__(self, batch: dict) -> dict:
        from orchard.api import kind_of

        cols = {"path": [], "error": [], "kind": [], "width": [], "height": [], "count": []}
        for path in batch["path"]:
            path = Path(str(path))
            try:
                rgb = read_image(path, self.max_pixels)
                density = count_image(self.model, rgb, self.tile, self.scale, self.batch)
                cv2.imwrite(str(self.out / "density" / f"{path.stem}.png"), density_png(density))
                values = ("", "", rgb.shape[1], rgb.shape[0], round(float(density.sum()), 3))
            except Exception as exc:  # one bad file never stops the run: skipped and counted by kind
                values = (str(exc).splitlines()[0][:200] or type(exc).__name__, kind_of(exc), 0, 0, 0.0)
            cols["path"].append(str(path))
            for key, value in zip(("error", "kind", "width", "height", "count"), values):
                cols[key].append(value)
        return {k: np.asarray(v) for k, v in cols.items()}


def predict_gpus(device: str, cluster_gpus: float) -> float:
    """GPUs per prediction actor: one where ``flower.eval_device`` asks for CUDA or is ``auto``
    on a cluster with GPUs (Ray shows an actor only the GPUs it asked for), else none."""
    if str(device).startswith("cuda"):
        if cluster_gpus <= 0:
            from orchard.api import ConfigError

            raise ConfigError("flower.eval_device", f"auto or cpu on a cluster without GPUs; {device!r} asks for one")
        return 1.0
    return 1.0 if device == "auto" and cluster_gpus > 0 else 0.0


def predict(cfg: dict, ctx, out: Path) -> dict[str, float]:
    """``mode=predict``: count every image of ``input`` (a file, a folder, or a folder holding
    images/) with ``model`` into ``out``, the predictions folder the core opened (renamed into
    place whole once this returns: orchard.config.registry.entry); predictions.csv, density PNGs,
    skipped.csv; images/s."""
    import ray

    from orchard.api import batch_predict, skipped

    f = cfg["flower"]

    def plan(meta: dict, source: Path) -> batch_predict.Plan:
        if source.is_dir() and (source / "images").is_dir():
            source = source / "images"
        return batch_predict.Plan(
            MODEL_FILE, Predictor, skipped.listed_inputs(source, IMAGE_SUFFIXES), ["path", "width", "height", "count"],
            "images", settings_arg="weights", subdir="density", desc="counting", source=source,
            args={"tile_size": int(meta.get("tile_size", 64)), "batch_size": int(f["eval_batch_size"]),
                  "device": f["eval_device"], "max_pixels": f.get("max_image_pixels")},
            num_gpus=predict_gpus(f["eval_device"], ray.cluster_resources().get("GPU", 0)))

    done = batch_predict.predict_inputs(cfg, ctx, out, "flower", plan)
    pixels = sum(int(r["width"]) * int(r["height"]) for r in done.good)
    return {**done.metrics, "predict/megapixels_per_s": pixels / 1e6 / max(done.elapsed_s, 1e-9),
            "predict/total_count": float(sum(float(r["count"]) for r in done.good))}