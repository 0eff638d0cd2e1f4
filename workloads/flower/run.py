"""mode=train for flower, on the driver: data -> train -> evaluate -> log model and figures.

Timing follows the thesis (4.2): the completion time is the slowest worker's training time;
evaluation happens after training from the saved model, so it never counts towards it.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from orchard.api import background, evicted_bytes, skipped, Storage

from . import baseline_counter, checkpoint, evaluate, figures
from .checkpoint import load_model, MODEL_FILE
from .data import synthetic_storage
from .loader import ensure_density_targets
from .preflight import enough_photos, enough_tiles_per_worker
from .throughput import training_parts, worker_metrics
from .tiles import bin_label, bin_sample, tile_cache, TileSet


def run(cfg: dict, ctx) -> dict[str, float]:
    """The whole train run on the driver; returns the final metrics."""
    from .model import FlowerCounterCNN, count_parameters
    from .train import launch_workers, loop_config

    f = cfg["flower"]
    started, evicted_from = time.perf_counter(), evicted_bytes()  # durations: the monotonic clock
    run_dir = Path(ctx.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    # 1. data
    # 1a. field images: the user's folder (a path or a storage URI), or the synthetic field kept
    #     in the run storage (same format); workers read both through storage (orchard/storage/)
    run_storage = ctx.storage
    data, data_hit = (Storage(f["data_dir"]), True) if f["data_dir"] else synthetic_storage(cfg)
    data_dir = data.uri
    # 1b. region-of-interest crop + tiling as parallel Ray tasks (3.3.1), reused when present
    #     (tiles.tile_cache). A photo that cannot be read is skipped and counted (data/skipped_*,
    #     skipped.csv); too many of them end the run here, one line naming the first
    #     (flower.max_skipped_fraction)
    tile_store, tiles_hit = tile_cache(cfg, data, run_storage)
    tiles = TileSet(tile_store.child("tiles").localize())
    print(f"flower: tiles {'read from' if tiles_hit else 'made and kept in'} {tile_store.child('tiles')}", flush=True)
    skipped.report(ctx, tiles.skipped, "flower")
    enough_photos(cfg, tiles.skipped, tiles.photos + len(tiles.skipped))
    # 1c. bin sampling (4.1.1): equal tiles per count bin, seeded 70/30 split
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
    # 1d. the older counter, tuned on training tiles (3.3.3) and run on the test tiles, as Ray
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

    # 2. train on the workers (train.py); the strategy (ring | ps sync | ps async) is the launcher's
    #    business. With val_fraction > 0 some training tiles are held back and scored after every
    #    val_every epochs by rank 0 (val/mae): the per-epoch metric a sweep's ASHA cuts on.
    run_storage.delete("workers")
    config = loop_config(cfg, tile_store, density, fit_idx, val_idx)
    prepared_s = time.perf_counter() - started
    ctx.mark("data")
    # what the ending imports (the model's exporter, its MLflow flavour, pyplot), imported while
    # the workers train: the ending runs on the driver alone (orchard/background.py)
    background.warm_imports("torch.export._trace", "mlflow.pytorch", "mlflow.models", "matplotlib.pyplot")
    # the launch on the wall clock too: the workers' first steps (their clocks) are compared with it
    train_started, train_from = time.time(), time.perf_counter()
    # a resumed run continues the previous run's Ray Train run and its checkpoints (checkpoint.py)
    launch_workers(config, cfg, ctx, checkpoint.resolve(ctx))
    metrics = {"time/train_wall_s": time.perf_counter() - train_from, "time/prepare_s": prepared_s}
    # the workers' summaries and the model come back through storage, never a driver path
    ctx.mark("training")
    metrics.update(worker_metrics(run_storage, f["warmup_steps"], train_started, evicted_bytes() - evicted_from))
    ctx.carve("training", training_parts(metrics))  # what the slowest worker's loop held
    evaluate_started = time.perf_counter()
    if not run_storage.is_local or run_storage.local_path != run_dir.resolve():
        (run_dir / MODEL_FILE).write_bytes(run_storage.read_bytes(MODEL_FILE))

    # 3. evaluate: accuracy on the held-out tiles, the CNN from the saved model vs the older counter
    #    (Table 5.1); the CNN on the run's device in batches, the blob counts came with its calibration (1d)
    model, scale = load_model(run_dir / MODEL_FILE, evaluate.eval_device(cfg))
    truth = tiles.counts[test_idx].astype(float)
    kinds = [tiles.kinds[i] for i in test_idx]
    maps, cnn_s = evaluate.predict_density(model, test_images, scale, f["eval_batch_size"])
    cnn_counts = maps.sum(axis=(1, 2))
    blob_counts, blob_s = np.asarray(baseline["test_counts"], float), float(baseline["test_s"])
    cnn_table = evaluate.error_table(cnn_counts, truth, f["bins"], kinds)
    blob_table = evaluate.error_table(blob_counts, truth, f["bins"], kinds)
    metrics.update(evaluate.flatten_table(cnn_table, "test", f["bins"]))
    # the blob counter beside the CNN in the test section (its overall errors, its speed); its
    # per-bin and per-scene errors, one point each, are the table and per_bin_mae figure, not charts
    metrics.update(evaluate.flatten_table({"overall": blob_table["overall"]}, "test", f["bins"], "baseline_"))
    metrics.update({"test/inference_s": cnn_s, "test/baseline_inference_s": blob_s,
                    "test/images_per_s": len(test_images) / max(cnn_s, 1e-9),
                    "test/baseline_images_per_s": len(test_images) / max(blob_s, 1e-9),
                    "train/baseline_calibration_mae": baseline["calibration_mae"]})
    ctx.log_dict({"cnn": cnn_table, "baseline": blob_table}, "tables/per_bin.json")
    ctx.set_tags({"flower.beats_baseline": str(metrics["test/mae"] < metrics["test/baseline_mae"])})
    metrics["time/evaluate_s"] = time.perf_counter() - evaluate_started
    ctx.mark("evaluation")

    # 4. log model and figures: density maps over the tiles, per-bin MAE and counts of both
    #    counters (figures.py); the MLflow Model, artifact model/ (predict.py, docs/models.md)
    figures.log_figures(ctx, picks=evaluate.pick_examples(truth, kinds, f["num_figures"], cfg["seed"]),
                        images=test_images, points=[tiles.points[i] for i in test_idx], maps=maps, truth=truth,
                        cnn_counts=cnn_counts, blob_counts=blob_counts, cnn_table=cnn_table, blob_table=blob_table,
                        names=[f"{tiles.names[i]} ({k})" for i, k in zip(test_idx, kinds)])
    ctx.mark("figures")
    from .predict import log_model

    log_model(ctx, run_dir / MODEL_FILE)  # the MLflow Model: artifact model/ (docs/models.md)
    ctx.mark("model")  # time/total_s is the lifecycle's: the time split's sum (orchard/tracking/time_split.py)
    return metrics
