"""What the driver does for mode=train: data -> tiles -> bins -> train -> evaluate.

Timing follows the thesis (4.2): the completion time is the slowest worker's training time;
evaluation happens after training from the saved model, so it never counts towards it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from orchard import skipped
from orchard.storage import Storage, evicted_bytes
from workloads.flower import (
    TRAIN_STORAGE_NOTE,
    baseline_counter,
    evaluate,
    figures,
    train_storage,
)
from workloads.flower.data import TileSet, bin_label, bin_sample, prepare_tiles
from workloads.flower.loader import ensure_density_targets
from workloads.flower.preflight import enough_photos
from workloads.flower.synthetic_field import generate_field


def synthetic_data(cfg: dict) -> Path:
    """The synthetic field for this config as a folder on this machine (see synthetic_storage)."""
    return synthetic_storage(cfg)[0].localize()


def synthetic_storage(cfg: dict) -> tuple[Storage, bool]:
    """The synthetic field for this config, generated once and kept in the run storage
    (``<storage root>/flower_data/synthetic-<key>``); returns (its folder, True if it was there).

    The folder name hashes every setting that changes the images, so runs that differ only in
    strategy or training knobs (the strategy comparison) train on identical tiles, and runs on
    other machines with the same ``storage.uri`` find them too.
    """
    f = cfg["flower"]
    settings = {"synthetic": f["synthetic"], "tile_size": f["tile_size"], "seed": cfg["seed"]}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    store = Storage.root(cfg).child("flower_data", f"synthetic-{digest}")
    if store.ready("images"):
        return store, True
    if not store.is_local:  # generate here, then publish the folder (marked complete last)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="orchard-flower-") as tmp:
            _generate(cfg, Path(tmp) / "field")
            store.upload(Path(tmp) / "field")
            store.write_bytes("images/_COMPLETE", b"complete\n")  # what ready("images") looks for
        return store, False
    root = store.local_path
    partial = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    _generate(cfg, partial)
    try:
        partial.rename(root)  # atomic: a concurrent run sees all of it or none of it
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)  # another run finished first: use its copy
    return store, False


def _generate(cfg: dict, partial: Path) -> None:
    f = cfg["flower"]
    s = f["synthetic"]
    generate_field(partial, num_images=s["num_images"], height=s["height"], width=s["width"],
                   tile_size=f["tile_size"], seed=cfg["seed"], mean_flowers_per_tile=s["mean_flowers_per_tile"],
                   flower_radius=tuple(s["flower_radius"]), occlusion=s["occlusion"],
                   distractor_rate=s["distractor_rate"], annotation=s["annotation"])


def throughput_stats(worker_files: list, warmup_steps: int) -> dict[str, float]:
    """Table 5.2 figures from the workers' per-step series, plus the completion time.

    The run's throughput at step i is the sum of every worker's images/s at its step i; the
    first `warmup_steps` steps (graph building, first all-reduce) are left out of mean/std/var.
    """
    summaries = [p if isinstance(p, dict) else json.loads(Path(p).read_text()) for p in worker_files]
    if not summaries:
        raise RuntimeError("no worker wrote its summary: training did not finish")
    length = min(len(s["throughput"]) for s in summaries)
    total = np.sum([np.asarray(s["throughput"][:length]) for s in summaries], axis=0)
    steady = total[warmup_steps:] if length > warmup_steps else total
    out = {"time/completion_s": max(s["completion_s"] for s in summaries),
           "throughput/mean_images_per_s": float(np.mean(steady)) if steady.size else float("nan"),
           "throughput/std_images_per_s": float(np.std(steady)) if steady.size else float("nan"),
           "throughput/var_images_per_s": float(np.var(steady)) if steady.size else float("nan"),
           "train/workers": float(len(summaries))}
    first_epoch = max(s["first_epoch"] for s in summaries)
    if first_epoch > 0:  # the group went on from a checkpoint (a resume, or a worker died: FailureConfig)
        out["train/resumed_from_epoch"] = float(first_epoch)  # a fresh run has no such metric
    for s in summaries:
        out[f"time/w{s['rank']}_completion_s"] = s["completion_s"]
        util = s.get("gpu_util") or []
        if util:
            out[f"system/w{s['rank']}_gpu_util_pct_mean"] = float(np.mean(util))
            out[f"system/w{s['rank']}_gpu_util_pct_std"] = float(np.std(util))
    return out


def cache_evicted(summaries: list[dict], driver_bytes: int) -> float:
    """``cache/evicted_bytes``: what the node caches evicted for this run (least recently used
    copies removed past ``storage.node_cache_max_gb``), the driver's ``driver_bytes`` and each
    Train worker's; a worker in the driver's own process (Train's local mode) is counted once."""
    return float(driver_bytes + sum(int(s.get("cache_evicted_bytes", 0)) for s in summaries
                                    if s.get("pid") != os.getpid()))


def time_split(summaries: list[dict], train_started: float) -> dict[str, float]:
    """Where the training wall time went: until the first step of any worker (Ray Train's start,
    worker start-up, the shard load), and the slowest worker's time in its step loops."""
    firsts = [s["first_step_at"] for s in summaries if s.get("first_step_at")]
    out = {"time/steps_s": max((float(s.get("steps_s", 0.0)) for s in summaries), default=0.0)}
    if firsts:
        out["time/train_start_s"] = min(firsts) - train_started
    return out


def check_remote_tables(data: Storage) -> None:
    """The CSVs of a data folder in remote storage, checked as the config check does a local
    one's (preflight.check_tables): a bad row is ConfigError, exit 2, before any tile is made."""
    import tempfile

    from orchard import ConfigError
    from workloads.flower.data import TABLES, TableError, check_tables

    with tempfile.TemporaryDirectory(prefix="orchard-flower-csv-") as tmp:
        for name in TABLES:
            if data.exists(name):
                (Path(tmp) / name).write_bytes(data.read_bytes(name))
        try:
            check_tables(Path(tmp))
        except TableError as exc:  # named by its URI, not the copy read here
            raise ConfigError("flower.data_dir", str(exc).replace(tmp, data.uri.rstrip("/"))) from None


def enough_tiles_per_worker(cfg: dict, train_tiles: int) -> None:
    """Refuse (ConfigError: the run FAILED, one line, exit 2) before Ray Train starts when the
    bin-sampled training tiles give a worker less than one batch."""
    from orchard import ConfigError

    f, workers = cfg["flower"], int(cfg["strategy"]["num_workers"])
    per_worker = train_tiles // workers
    if per_worker < f["batch_size"]:
        raise ConfigError("flower.batch_size", f"at most {per_worker} here: bin sampling left {train_tiles} training "
                          f"tiles for {workers} workers (or: more flower.synthetic.num_images, a smaller "
                          f"flower.tile_size, fewer strategy.num_workers)")


def run_train(cfg: dict, ctx) -> dict[str, float]:
    """The whole train run on the driver; returns the final metrics."""
    from orchard.strategies import launch
    from workloads.flower.model import FlowerCounterCNN, count_parameters
    from workloads.flower.train import MODEL_FILE, load_model, raise_if_diverged, train_loop

    f = cfg["flower"]
    started, evicted_from = time.time(), evicted_bytes()
    run_dir = Path(ctx.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    # [1] field images: the user's folder (a path or a storage URI), or the synthetic field kept
    #     in the run storage (same format); workers read both through storage (orchard/storage.py)
    run_storage = Storage.for_run(cfg, run_dir)
    data, data_hit = (Storage(f["data_dir"]), True) if f["data_dir"] else synthetic_storage(cfg)
    data_dir = data.uri
    # [2] region-of-interest crop + tiling as parallel Ray tasks (3.3.1); reused when present:
    #     the synthetic field's tiles are keyed by its content, so other runs and nodes share them
    #     A photo that cannot be read is skipped and counted (data/skipped_*, skipped.csv); too
    #     many of them end the run here, one line naming the first (flower.max_skipped_fraction)
    tile_store = data.child(f"tiles-{f['tile_size']}") if not f["data_dir"] else run_storage
    tiles_hit = tile_store.ready("tiles")
    if not tiles_hit:
        if f["data_dir"] and not data.is_local:  # a local folder's CSVs were checked before Ray started
            check_remote_tables(data)
        max_pixels = f["max_image_pixels"]
        if tile_store.is_local:
            prepare_tiles(data, tile_store.local_path, f["tile_size"], f["roi"], max_pixels=max_pixels)
        else:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="orchard-tiles-") as tmp:
                prepare_tiles(data, tmp, f["tile_size"], f["roi"], max_pixels=max_pixels)
                tile_store.upload(Path(tmp) / "tiles", "tiles")
    tiles = TileSet(tile_store.child("tiles").localize())
    print(f"flower: tiles {'read from' if tiles_hit else 'made and kept in'} {tile_store.child('tiles')}", flush=True)
    skipped.report(ctx, tiles.skipped, "flower")
    enough_photos(cfg, tiles.skipped, tiles.photos + len(tiles.skipped))
    # [3] bin sampling (4.1.1): equal tiles per count bin, seeded 70/30 split
    train_idx, test_idx, bin_sizes = bin_sample(tiles.counts, f["bins"], f["train_fraction"], cfg["seed"])
    ctx.log_params({"flower.resolved_data_dir": str(data_dir), "flower.tiles_total": len(tiles),
                    "flower.train_tiles": len(train_idx), "flower.test_tiles": len(test_idx),
                    "flower.model_params": count_parameters(FlowerCounterCNN()),
                    "flower.effective_batch": f["batch_size"] * cfg["strategy"]["num_workers"]})
    ctx.log_dict({"bins": [bin_label(b) for b in f["bins"]], "tiles_per_bin": bin_sizes,
                  "sampled_per_bin": min(s for s in bin_sizes if s > 0)}, "tables/bins.json")
    n_val = int(round(float(f.get("val_fraction", 0.0)) * len(train_idx)))
    val_idx = train_idx[np.random.default_rng((cfg["seed"], 1)).permutation(len(train_idx))[:n_val]]
    fit_idx = np.setdiff1d(train_idx, val_idx)
    enough_tiles_per_worker(cfg, len(fit_idx))  # before Train starts: one line, exit 2
    # the training targets, made once per tile cache and sigma and kept beside it (loader.py)
    density, density_hit = ensure_density_targets(tile_store, tiles, f["sigma"])

    # [4] the older counter, tuned on training tiles (3.3.3) and run on the test tiles, as Ray
    #     tasks; kept beside the tiles under their content, so the next run on them reads it back
    b = f["baseline"]
    calib = train_idx[np.random.default_rng(cfg["seed"]).permutation(len(train_idx))[:b["calibration_tiles"]]]
    grid = {k: b[k] for k in ("cutoffs", "thresholds", "gain", "min_sigma", "max_sigma")}
    test_images = np.asarray(tiles.images[test_idx])
    import ray

    baseline, baseline_hit = baseline_counter.cached_calibration(
        tile_store.child("baseline"), np.asarray(tiles.images[calib]), tiles.counts[calib], test_images, grid,
        cpus=max(1, int(ray.available_resources().get("CPU", 1))))
    params = baseline["params"]
    ctx.log_params({f"flower.baseline.fitted_{k}": v for k, v in params.items()})
    hits = {"data": data_hit, "tiles": tiles_hit, "density": density_hit, "baseline": baseline_hit}
    ctx.log_metrics({f"cache/{k}_{kind}": float(v == (kind == "hits")) for k, v in hits.items()
                     for kind in ("hits", "misses")})
    ctx.set_tags({"flower.preparation": "reused" if all(hits.values()) else "made",
                  "flower.baseline": "reused" if baseline_hit else "calibrated"})

    # [5] train on the workers; the strategy (ring | ps sync | ps async) is the launcher's business.
    #     With val_fraction > 0 some training tiles are held back and scored after every
    #     val_every epochs by rank 0 (val/mae): the per-epoch metric a sweep's ASHA cuts on.
    run_storage.delete("workers")
    loop_config = {
        "cache": tile_store.child("tiles"), "density": density, "train_idx": fit_idx.tolist(),
        "run_storage": run_storage, "val_idx": val_idx.tolist(), "val_every": int(f.get("val_every", 1)),
        "seed": cfg["seed"], "batch_size": f["batch_size"], "prefetch": f["prefetch"], "epochs": f["epochs"],
        "density_scale": f["density_scale"], "optimizer": dict(f["optimizer"]),
        "profile_every": f["profile_every"], "checkpoint_every": cfg["strategy"].get("checkpoint_every", 1),
        "fail_at_epoch": f.get("fail_at_epoch"), "log_every": f["log_every"], "warmup_steps": f["warmup_steps"],
        "precision": f["precision"], "channels_last": f["channels_last"], "compile": f["compile"],
        "loader_threads": f["loader_threads"], "eval_batch_size": f["eval_batch_size"],
    }
    prepared_s = time.time() - started
    train_started = time.time()
    # A resumed run continues the previous run's Train run (same storage path and name): Ray
    # Train restores its latest checkpoint, and new checkpoints join it there.
    storage = train_storage(cfg, f["resume"]) if f.get("resume") else run_storage.child("train")
    run_storage.write_text(TRAIN_STORAGE_NOTE, storage.uri)  # a resume of this run finds it
    try:
        launch(train_loop, loop_config, cfg, ctx, name="flower", storage_path=storage.uri)
    except Exception:
        raise_if_diverged(run_storage, storage, ctx)  # a worker raised Diverged: that, not Train's error
        raise
    raise_if_diverged(run_storage, storage, ctx)  # a worker diverged, the group Train restarted ended at once
    metrics = {"time/train_wall_s": time.time() - train_started, "time/prepare_s": prepared_s}
    # the workers' summaries and the model come back through storage, never a driver path
    summaries = [run_storage.read_json(f"workers/{name}") for name in run_storage.list("workers")
                 if name.startswith("rank") and name.endswith(".json")]
    metrics.update(throughput_stats(summaries, f["warmup_steps"]))
    metrics.update(time_split(summaries, train_started))
    metrics["cache/evicted_bytes"] = cache_evicted(summaries, evicted_bytes() - evicted_from)
    evaluate_started = time.time()
    if not run_storage.is_local or run_storage.local_path != run_dir.resolve():
        (run_dir / MODEL_FILE).write_bytes(run_storage.read_bytes(MODEL_FILE))

    # [6] accuracy on the held-out tiles: CNN from the saved model vs the older counter (Table 5.1)
    #     the CNN on the run's device in batches; the blob counts came with the calibration ([4])
    model, scale = load_model(run_dir / MODEL_FILE, evaluate.eval_device(cfg))
    truth = tiles.counts[test_idx].astype(float)
    kinds = [tiles.kinds[i] for i in test_idx]
    maps, cnn_s = evaluate.predict_density(model, test_images, scale, f["eval_batch_size"])
    cnn_counts = maps.sum(axis=(1, 2))
    blob_counts, blob_s = np.asarray(baseline["test_counts"], float), float(baseline["test_s"])
    cnn_table = evaluate.error_table(cnn_counts, truth, f["bins"], kinds)
    blob_table = evaluate.error_table(blob_counts, truth, f["bins"], kinds)
    metrics.update(evaluate.flatten_table(cnn_table, "test", f["bins"]))
    metrics.update(evaluate.flatten_table(blob_table, "baseline", f["bins"]))
    metrics.update({"test/inference_s": cnn_s, "baseline/inference_s": blob_s,
                    "test/images_per_s": len(test_images) / max(cnn_s, 1e-9),
                    "baseline/images_per_s": len(test_images) / max(blob_s, 1e-9),
                    "baseline/calibration_mae": baseline["calibration_mae"]})
    ctx.log_dict({"cnn": cnn_table, "baseline": blob_table}, "tables/per_bin.json")
    ctx.set_tags({"flower.beats_baseline": str(metrics["test/mae"] < metrics["baseline/mae"])})
    metrics["time/evaluate_s"] = time.time() - evaluate_started

    # [7] figures (figures.py): density maps over the tiles, per-bin MAE and counts of both counters
    figures.log_figures(ctx, picks=evaluate.pick_examples(truth, kinds, f["num_figures"], cfg["seed"]),
                        images=test_images, points=[tiles.points[i] for i in test_idx], maps=maps, truth=truth,
                        cnn_counts=cnn_counts, blob_counts=blob_counts, cnn_table=cnn_table, blob_table=blob_table,
                        names=[f"{tiles.names[i]} ({k})" for i, k in zip(test_idx, kinds)])
    from workloads.flower.predict import log_model

    log_model(ctx, run_dir / MODEL_FILE)  # the MLflow Model: artifact model/ (docs/models.md)
    metrics["time/total_s"] = time.time() - started
    return metrics

