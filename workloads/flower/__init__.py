"""workload=flower: the canola flower-counting CNN of the U. Saskatchewan MSc thesis "A scalable
CNN canola flower counter" (docs/papers.md), trained with ring all-reduce or parameter servers.

The contract the core reads; the core calls run.py (mode=train) and predict.py (mode=predict)
itself (orchard/config/registry.py). Light on purpose: heavy imports happen in those files.
"""
from __future__ import annotations

from pathlib import Path

from orchard.api import ConfigError, require

from .checkpoint import train_storage

STRATEGIES = ("ring", "ps")


def _valid_bins(bins) -> bool:
    """Inclusive [low, high|null] ranges, increasing and non-overlapping."""
    if not isinstance(bins, list) or not bins:
        return False
    previous_high = -1
    for b in bins:
        if not isinstance(b, (list, tuple)) or len(b) != 2 or not isinstance(b[0], int) or b[0] <= previous_high:
            return False
        if b[1] is not None and (not isinstance(b[1], int) or b[1] < b[0]):
            return False
        previous_high = float("inf") if b[1] is None else b[1]
    return True


def validate(cfg: dict) -> None:
    """Reject a bad flower config before Ray starts (orchard.ConfigError(key, allowed))."""
    from orchard.api import schema, Storage

    from .schema import Flower

    if cfg["strategy"]["name"] not in STRATEGIES:
        raise ConfigError("strategy", f"one of {', '.join(STRATEGIES)} for workload=flower, got {cfg['strategy']['name']}")
    schema.check(Flower, cfg["flower"], "flower")  # each key's type and range (workloads/flower/schema.py)
    require(cfg, "flower.bins", _valid_bins,
            "a list of increasing, non-overlapping [low, high] count ranges (high may be null)")
    if cfg["mode"] == "train":
        require(cfg, "flower.resume", lambda v: v is None or train_storage(Storage.previous_run(cfg)).exists("flower"),
                "null or the folder of a train run that checkpointed (holding train/flower/)")
        require(cfg, "flower.data_dir", lambda v: v is None or (Path(v) / "images").is_dir(),
                "null (synthetic field) or a folder holding images/ (and points.csv or annotated/)")
        from . import preflight

        preflight.check(cfg)  # tile vs field, tiles per worker, precision and GPU settings


def resume(cfg: dict, previous_run_dir: str) -> None:
    """``python -m orchard resume <run id>``: continue that run's Ray Train run where it stopped."""
    if cfg["mode"] != "train":
        raise ConfigError("mode", "train: only a training run has checkpoints to resume from")
    cfg["flower"]["resume"] = str(previous_run_dir)
    validate(cfg)


def resources(cfg: dict):
    """What a run holds in Ray (orchard/cluster/placement.py).  Training: the Ray Train workers, in a
    placement group of their own; inside the run's own reservation, the 1-CPU tasks of the
    tiling step and of the blob counter's calibration (tiles.prepare_tiles, baseline_counter; one
    at a time there) and, for strategy=ps, servers that hold CPUs."""
    from orchard.api import Resources, bundles

    s = cfg["strategy"]
    if cfg["mode"] == "predict":  # an actor pool of 1 CPU each, as many as fit (orchard/models/__init__.py)
        return Resources(in_trial=bundles(1, 1.0))
    servers = bundles(s["num_servers"], s.get("cpus_per_server", 0)) if s["name"] == "ps" else ()
    return Resources(in_trial=bundles(1, 1.0) + servers,
                     outside=bundles(s["num_workers"], s.get("cpus_per_worker", 1), s.get("gpus_per_worker", 0)))


def headline(cfg: dict, metrics: dict) -> list[str]:
    """The thesis's question (Table 5.1): does the CNN count better than the blob counter?"""
    cnn, blob = metrics["test/mae"], metrics["test/baseline_mae"]
    verdict = "better" if cnn < blob else "not better"
    return [f"count MAE: CNN {cnn:.3g} vs blob counter {blob:.3g} ({cnn / blob:.2f}x, {verdict})"]


def headline_metric(metrics: dict) -> tuple[str, float]:
    """The one figure runs are compared by (``headline/count_mae``): the CNN's test count MAE."""
    return "count_mae", metrics["test/mae"]


def dataset(cfg: dict) -> dict:
    """What a train run learns from, for its MLflow dataset input (orchard/tracking/datasets.py)."""
    f = cfg["flower"]
    if f["data_dir"]:
        return {"name": f"field photos {Path(f['data_dir']).name}", "path": f["data_dir"]}
    syn = f["synthetic"]
    return {"name": f"synthetic field {syn['num_images']}x{syn['width']}x{syn['height']}",
            "generator": "workloads.flower.synthetic_field", "settings": {**syn, "seed": cfg["seed"]}}

