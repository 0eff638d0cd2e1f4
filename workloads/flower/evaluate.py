"""Accuracy after training (4.2, Table 5.1) for the CNN and the older counter, on the same tiles.

The thesis measured accuracy only after training, loading the last checkpoint, so evaluation
never counts towards the completion time. Relative error excludes zero-count tiles (5.1).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .tiles import assign_bins, bin_label


def count_errors(predicted: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """MAE, RMSE and mean relative error (|p - t| / t over tiles with t > 0; nan if none)."""
    predicted, truth = np.asarray(predicted, float), np.asarray(truth, float)
    if truth.size == 0:
        return {"mae": float("nan"), "rmse": float("nan"), "relative_error": float("nan"), "tiles": 0.0}
    err = predicted - truth
    nonzero = truth > 0
    rel = float(np.mean(np.abs(err[nonzero]) / truth[nonzero])) if nonzero.any() else float("nan")
    return {"mae": float(np.mean(np.abs(err))), "rmse": float(np.sqrt(np.mean(err**2))),
            "relative_error": rel, "tiles": float(truth.size)}


def metric_label(bin_range) -> str:
    """A bin's name usable in an MLflow key ('+' is not allowed there): '0', '3-4', '8up'."""
    return bin_label(bin_range).replace("+", "up")


def error_table(predicted: np.ndarray, truth: np.ndarray, bins, kinds: list[str]) -> dict[str, dict]:
    """{'overall': errors, 'bin 3-4': errors, ..., 'glare': errors, ...} (Table 5.1 + scene kinds)."""
    table = {"overall": count_errors(predicted, truth)}
    which = assign_bins(truth, bins)
    for b, bin_range in enumerate(bins):
        table[f"bin {bin_label(bin_range)}"] = count_errors(predicted[which == b], truth[which == b])
    kinds = np.asarray(kinds)
    for kind in sorted(set(kinds.tolist())):
        table[kind] = count_errors(predicted[kinds == kind], truth[kinds == kind])
    return table


def flatten_table(table: dict[str, dict], prefix: str, bins, lead: str = "") -> dict[str, float]:
    """MLflow keys: <prefix>/<lead>mae, <prefix>/<lead>bin_3-4_mae, <prefix>/<lead>glare_mae, ..."""
    labels = {f"bin {bin_label(b)}": f"bin_{metric_label(b)}_" for b in bins}
    out = {}
    for row, errors in table.items():
        stem = lead + ("" if row == "overall" else labels.get(row, f"{row}_"))
        for name in ("mae", "rmse", "relative_error"):
            if not np.isnan(errors[name]):
                out[f"{prefix}/{stem}{name}"] = errors[name]
    return out


def eval_device(cfg: dict) -> str:
    """flower.eval_device: ``auto`` is the GPU when the run trains on GPUs and this process sees
    one, else the CPU; or a torch device string (``cpu``, ``cuda``, ``cuda:1``)."""
    chosen = cfg["flower"].get("eval_device", "auto")
    if chosen != "auto":
        return chosen
    wants_gpu = float(cfg["strategy"].get("gpus_per_worker", 0) or 0) > 0
    return "cuda" if wants_gpu and torch.cuda.is_available() else "cpu"


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are (the CPU for a model without any)."""
    return next(model.parameters(), torch.empty(0)).device


@torch.no_grad()
def predict_density(model: torch.nn.Module, images: np.ndarray, scale: float, batch_size: int = 64,
                    device=None) -> tuple[np.ndarray, float]:
    """Density maps (N, H, W) in flowers per pixel for uint8 images (N, H, W, 3), and seconds.

    Runs in batches of ``batch_size`` tiles on ``device`` (default: the model's own device);
    tiles travel as uint8 and become float there. The model is moved to ``device`` if needed.
    """
    start = time.perf_counter()
    device = torch.device(device) if device is not None else model_device(model)
    model = model.to(device)
    maps = []
    for i in range(0, len(images), batch_size):
        x = torch.from_numpy(np.ascontiguousarray(images[i:i + batch_size])).to(device, non_blocking=True)
        x = x.permute(0, 3, 1, 2).float().div_(255.0)
        # The final 1x1 conv is linear, so an undertrained model can predict negative density;
        # no flower has negative mass, so counts clamp it at zero.
        maps.append(model(x).squeeze(1).clamp_(min=0.0).div_(scale))
    out = torch.cat(maps).cpu().numpy() if maps else np.zeros((0,) + images.shape[1:3], np.float32)
    return out, time.perf_counter() - start


def pick_examples(counts: np.ndarray, kinds: list[str], how_many: int, seed: int) -> list[int]:
    """Positions of a spread of test tiles: distractor scenes first, then a range of counts."""
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for kind in ("glare", "roadside", "shadow"):
        where = [i for i, k in enumerate(kinds) if k == kind]
        if where and len(chosen) < how_many:
            chosen.append(int(rng.choice(where)))
    for i in np.argsort(-np.asarray(counts), kind="stable"):
        if len(chosen) >= how_many:
            break
        if int(i) not in chosen and (not chosen or counts[i] != counts[chosen[-1]]):
            chosen.append(int(i))
    return chosen[:how_many]
