"""flower.mode=predict: count flowers in new images of any size with a trained model.

Each image is padded (by reflection) up to whole tiles, cut into tiles of the training size,
counted tile by tile (bounded memory, as in training), and the stitched density map is cropped
back to the image: the count is its sum. Writes counts.csv and one density PNG per image.
"""
from __future__ import annotations

import csv
import time
from pathlib import Path

import cv2
import numpy as np

from workloads.flower.data import IMAGE_SUFFIXES, read_rgb


def image_files(folder: str | Path) -> list[Path]:
    """Images directly in folder, or in folder/images (the training layout), sorted."""
    folder = Path(folder)
    if (folder / "images").is_dir():
        folder = folder / "images"
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def count_image(model, rgb: np.ndarray, tile_size: int, scale: float, batch_size: int = 16) -> np.ndarray:
    """Density map (H, W) in flowers per pixel for an RGB uint8 image (H, W, 3) of any size."""
    from workloads.flower.evaluate import predict_density

    height, width = rgb.shape[:2]
    pad_h, pad_w = -height % tile_size, -width % tile_size
    # Reflection keeps field texture at the edge (black padding would look like shadow);
    # the padded area is cropped away before counting.
    mode = cv2.BORDER_REFLECT_101 if min(height, width) > 1 else cv2.BORDER_REPLICATE
    padded = cv2.copyMakeBorder(rgb, 0, pad_h, 0, pad_w, mode)
    rows, cols = padded.shape[0] // tile_size, padded.shape[1] // tile_size
    tiles = padded.reshape(rows, tile_size, cols, tile_size, 3).swapaxes(1, 2).reshape(-1, tile_size, tile_size, 3)
    maps, _ = predict_density(model, tiles, scale, batch_size)
    stitched = maps.reshape(rows, cols, tile_size, tile_size).swapaxes(1, 2).reshape(rows * tile_size, cols * tile_size)
    return stitched[:height, :width]


def density_png(density: np.ndarray) -> np.ndarray:
    """A BGR colour image of a density map (jet colormap, max density = red)."""
    peak = float(density.max())
    unit = np.clip(density / peak, 0, 1) if peak > 0 else np.zeros_like(density)
    return cv2.applyColorMap((unit * 255).astype(np.uint8), cv2.COLORMAP_JET)


def run_predict(cfg: dict, ctx) -> dict[str, float]:
    """Count every image under flower.input; log counts.csv, density PNGs and images/s."""
    import torch

    from workloads.flower.train import load_model

    f = cfg["flower"]
    data = torch.load(Path(f["checkpoint"]), map_location="cpu", weights_only=True)
    tile_size = int(data.get("tile_size", f["tile_size"]))  # the size it was trained on
    model, scale = load_model(f["checkpoint"])
    out_dir = Path(f["output"]) if f["output"] else Path(ctx.run_dir) / "predictions"
    (out_dir / "density").mkdir(parents=True, exist_ok=True)
    files = image_files(f["input"])
    if not files:
        raise FileNotFoundError(f"no images in {f['input']}")
    rows, pixels = [], 0
    started = time.perf_counter()
    for i, path in enumerate(files):
        rgb = read_rgb(path)
        density = count_image(model, rgb, tile_size, scale)
        rows.append((path.name, rgb.shape[1], rgb.shape[0], round(float(density.sum()), 3)))
        pixels += rgb.shape[0] * rgb.shape[1]
        cv2.imwrite(str(out_dir / "density" / f"{path.stem}.png"), density_png(density))
        ctx.progress(i + 1, len(files), desc="counting")
    elapsed = time.perf_counter() - started
    with open(out_dir / "counts.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("image", "width", "height", "count"))
        writer.writerows(rows)
    ctx.log_artifact(out_dir / "counts.csv", "predictions")
    for png in sorted((out_dir / "density").glob("*.png")):
        ctx.log_artifact(png, "predictions/density")
    return {"predict/images": float(len(files)), "predict/images_per_s": len(files) / max(elapsed, 1e-9),
            "predict/megapixels_per_s": pixels / 1e6 / max(elapsed, 1e-9),
            "predict/total_count": float(sum(r[3] for r in rows))}
