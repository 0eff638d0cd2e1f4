"""workload=flower: the canola flower-counting CNN of the MSc thesis
(../shared/seeds/001_645c270b6b9ac541.txt), trained with ring all-reduce or parameter servers.

Light on purpose: heavy imports happen inside `run`.
"""
from __future__ import annotations

from pathlib import Path

from orchard import ConfigError
from orchard.config import require, require_choice, require_positive

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
    if cfg["strategy"]["name"] not in STRATEGIES:
        raise ConfigError("strategy", f"one of {', '.join(STRATEGIES)} for workload=flower, got {cfg['strategy']['name']}")
    require(cfg, "flower.tile_size", lambda v: isinstance(v, int) and v > 0 and v % 4 == 0,
            "a positive multiple of 4 (the model pools twice by 2x2)")
    for key in ("batch_size", "epochs", "prefetch"):
        require_positive(cfg, f"flower.{key}", integer=True)
    for key in ("sigma", "density_scale"):
        require_positive(cfg, f"flower.{key}")
    require(cfg, "flower.train_fraction", lambda v: 0 < v < 1, "a fraction in (0, 1)")
    require(cfg, "flower.val_fraction", lambda v: 0 <= v < 0.5, "a fraction in [0, 0.5): training tiles held back")
    require_positive(cfg, "flower.val_every", integer=True)
    require(cfg, "flower.bins", _valid_bins,
            "a list of increasing, non-overlapping [low, high] count ranges (high may be null)")
    require_choice(cfg, "flower.optimizer.name", ("sgd", "adagrad", "adam"))
    require_positive(cfg, "flower.optimizer.lr")
    require(cfg, "flower.roi", lambda v: v is None or (isinstance(v, list) and len(v) == 4 and v[2] > 0 and v[3] > 0),
            "null or [x, y, width, height]")
    require(cfg, "flower.max_image_pixels", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
            "null (no limit) or a positive number of pixels (width x height)")
    require(cfg, "flower.max_skipped_fraction", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and 0 <= v <= 1, "a fraction in [0, 1] of the photos that may be unreadable before the run fails")
    require_choice(cfg, "flower.synthetic.annotation", ("csv", "red_cross"))
    require_choice(cfg, "flower.precision", ("fp32", "bf16", "fp16"))
    for key in ("channels_last", "compile"):
        require(cfg, f"flower.{key}", lambda v: isinstance(v, bool), "true or false")
    for key in ("log_every", "eval_batch_size"):
        require_positive(cfg, f"flower.{key}", integer=True)
    require(cfg, "flower.loader_threads", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
            "null (the worker's CPUs decide) or a positive integer")
    require(cfg, "flower.eval_device", lambda v: v in ("auto", "cpu") or str(v).startswith("cuda"),
            "auto, cpu or cuda[:index]")
    if cfg["mode"] == "train":
        require(cfg, "flower.resume", lambda v: v is None or train_storage(cfg, v).exists("flower"),
                "null or the folder of a train run that checkpointed (holding train/flower/)")
        require(cfg, "flower.data_dir", lambda v: v is None or (Path(v) / "images").is_dir(),
                "null (synthetic field) or a folder holding images/ (and points.csv or annotated/)")
        from workloads.flower import preflight

        preflight.check(cfg)  # tile vs field, tiles per worker, precision and GPU settings


TRAIN_STORAGE_NOTE = "train_storage.txt"  # in a run folder: where its Ray Train run keeps checkpoints


def train_storage(cfg: dict, run_dir):
    """Where a train run's Ray Train checkpoints live (an ``orchard.storage.Storage``): the run's
    storage + ``/train``, or, for a run that resumed another, the storage it continued (named in
    its ``train_storage.txt``).  Read from the run storage, so the driver's folder may be gone."""
    from orchard.storage import Storage

    run = Storage.for_run(cfg, run_dir)
    return Storage(run.read_text(TRAIN_STORAGE_NOTE).strip()) if run.exists(TRAIN_STORAGE_NOTE) else run.child("train")


def resume(cfg: dict, previous_run_dir: str) -> None:
    """``python -m orchard resume <run id>``: continue that run's Ray Train run where it stopped."""
    if cfg["mode"] != "train":
        raise ConfigError("mode", "train: only a training run has checkpoints to resume from")
    cfg["flower"]["resume"] = str(previous_run_dir)
    validate(cfg)


def resources(cfg: dict):
    """What a run holds in Ray (orchard/placement.py).  Training: the Ray Train workers, in a
    placement group of their own; inside the run's own reservation, the 1-CPU tasks of the
    tiling step and of the blob counter's calibration (data.prepare_tiles, baseline_counter; one
    at a time there) and, for strategy=ps, servers that hold CPUs."""
    from orchard.placement import Resources, bundles

    s = cfg["strategy"]
    if cfg["mode"] == "predict":  # an actor pool of 1 CPU each, as many as fit (orchard/models.py)
        return Resources(in_trial=bundles(1, 1.0))
    servers = bundles(s["num_servers"], s.get("cpus_per_server", 0)) if s["name"] == "ps" else ()
    return Resources(in_trial=bundles(1, 1.0) + servers,
                     outside=bundles(s["num_workers"], s.get("cpus_per_worker", 1), s.get("gpus_per_worker", 0)))


def headline(cfg: dict, metrics: dict) -> list[str]:
    """The thesis's question (Table 5.1): does the CNN count better than the blob counter?"""
    cnn, blob = metrics["test/mae"], metrics["baseline/mae"]
    verdict = "better" if cnn < blob else "not better"
    return [f"count MAE: CNN {cnn:.3g} vs blob counter {blob:.3g} ({cnn / blob:.2f}x, {verdict})"]


def headline_metric(metrics: dict) -> tuple[str, float]:
    """The one figure runs are compared by (``headline/count_mae``): the CNN's test count MAE."""
    return "count_mae", metrics["test/mae"]


def dataset(cfg: dict) -> dict:
    """What a train run learns from, for its MLflow dataset input (orchard/datasets.py)."""
    f = cfg["flower"]
    if f["data_dir"]:
        return {"name": f"field photos {Path(f['data_dir']).name}", "path": f["data_dir"]}
    syn = f["synthetic"]
    return {"name": f"synthetic field {syn['num_images']}x{syn['width']}x{syn['height']}",
            "generator": "workloads.flower.synthetic_field", "settings": {**syn, "seed": cfg["seed"]}}


def run(cfg: dict, ctx) -> dict[str, float]:
    """Train and evaluate (mode=train) or count flowers in new images (mode=predict)."""
    if cfg["mode"] == "predict":
        from workloads.flower.predict import run_predict

        return run_predict(cfg, ctx)
    from workloads.flower.driver import run_train

    return run_train(cfg, ctx)
