"""``workload=video``, mode=train: data -> master -> streaming pipeline -> two streams -> fusion -> inference.

The numbered steps are the notes' layers: 1. the data (videos stay videos: data.py), the master
and the cache layer (master.py, cache.py), the validation segments' features; 2. the epochs
(decode and feature stages feeding the CNN training layer, validation, worker shifting:
train.py); 3. the aggregation (fusion) layer on the validation set (evaluate.py,
aggregation.py), inference on untrimmed video (inference.py) and the storage/caching report;
4. the figures (figures.py) and the MLflow model (predict.py).
"""
from __future__ import annotations

import time


def run(cfg: dict, ctx) -> dict[str, float]:
    """Train and evaluate the two-stream pipeline; returns the final metrics."""
    from .operator_metrics import pipeline_budget

    with pipeline_budget(cfg["video"].get("object_store_mb")):
        return _run(cfg, ctx)


def _run(cfg: dict, ctx) -> dict[str, float]:
    import resource

    import ray

    from . import figures
    from .cache import accumulate, cache_dir, make_cache
    from .checkpoint import load_checkpoint
    from .data import index_videos, untrimmed_videos, with_videos
    from .evaluate import fusion, val_features
    from .extractors import load_modules
    from .inference import inference_columns, inference_segments, run_inference
    from .master import evenly_spaced_segments, start_master
    from .operator_metrics import operator_metrics, operator_summaries
    from .pipeline import frame_count
    from .evaluate import training_highlight_metrics
    from .predict import log_model
    from .train import stream_channels, train_epochs, wait_fractions

    ray.data.DataContext.get_current().enable_progress_bars = False
    vcfg, t_start = cfg["video"], time.perf_counter()
    seed = int(cfg["seed"])
    modules = list(vcfg.get("extractor_modules") or [])
    load_modules(modules)
    store = cache_dir(cfg)

    # 1. data: index the videos (frame pts, read once and kept), set non-videos aside (counted by
    #    kind); synthetic videos are written to storage first (data.py)
    index, train_ids, val_ids, skipped_by_kind = index_videos(cfg, ctx, store)
    classes, num_classes = index.classes, len(index.classes)
    #    and the untrimmed videos for inference (synthetic ones written to storage): their windows
    #    ride the training pipeline after its last epoch
    videos = untrimmed_videos(cfg, classes, ctx.storage.child("untrimmed"))
    phase_s = {"data": time.perf_counter() - t_start, "train": 0.0, "val": 0.0}
    ctx.mark("data")

    #    the master (sampler, control, monitor) and the cache layer
    master = start_master(index.labels, index.lengths, seed)
    cache = make_cache(vcfg["cache"], store.child("features").uri, float(vcfg["cache_max_mb"]))
    streams = {s: {"feature": f, "num_classes": num_classes,
                   "in_channels": stream_channels(f, int(vcfg["stack"]), vcfg["extractor_options"], int(vcfg["size"]))}
               for s, f in vcfg["streams"].items()}
    features = sorted({spec["feature"] for spec in streams.values()})
    count = frame_count(features, int(vcfg["stack"]), modules)
    val_segments = evenly_spaced_segments(index.labels, index.lengths, val_ids, int(vcfg["val_segments"]), count)
    epochs = int(vcfg["epochs"])
    # a resumed run (python -m orchard resume) goes on from the previous run's video checkpoint,
    # read from storage alone (the driver's folder may be gone): its states, allocation, history
    resumed = load_checkpoint(ctx.previous_storage) if ctx.previous_storage is not None else None
    first_epoch = 0 if resumed is None else epochs if resumed["training_done"] else int(resumed["epoch"]) + 1
    op_summaries = []
    if resumed:  # at once: it says what this run is while it trains (and again with the final metrics)
        ctx.log_metrics({"train/resumed_from_epoch": float(first_epoch)})
    cache_totals = {"hits": 0, "misses": 0, "saved_s": 0.0}

    #    the validation segments' features, once: every epoch scores the streams on the same arrays.
    #    They ride ahead of epoch 0 in the training pipeline (train.py); only a run with nothing left
    #    to train (resumed after its last epoch) has them decoded here, on their own
    val_data = None
    if first_epoch >= epochs:
        t_phase = time.perf_counter()
        val_data = val_features(val_segments, features, index, vcfg, master, cache)
        accumulate(cache_totals, ray.get(master.stage_stats.remote(True)))
        op_summaries += operator_summaries(master)
        phase_s["val"] += time.perf_counter() - t_phase
        ctx.mark("validation")
    validated_before = phase_s["val"]
    windows = inference_segments(videos, count, int(vcfg["inference"]["window_stride"]), vcfg["decoder"],
                                 first_id=len(index.paths))

    # 2. train: the master draws each epoch's segment seeds, one pipeline feeds one Ray Train run
    #    per stream; every epoch is validated, checkpointed and may shift a worker (train.py)
    trained = train_epochs(cfg, ctx, index=with_videos(index, videos), train_ids=train_ids, streams=streams,
                           features=features, count=count, master=master, cache=cache, val_data=val_data,
                           val_segments=val_segments, after_segments=windows,
                           after_columns=inference_columns(features), resumed=resumed, first_epoch=first_epoch,
                           cache_totals=cache_totals, phase_s=phase_s)
    ctx.mark("training")
    ctx.carve("training", {"validation": phase_s["val"] - validated_before})  # every epoch's, on the driver
    models, scores, labels, val = trained.models, trained.scores, trained.labels, trained.val
    # Ray Data's own per-operator figures of the training pipeline (one execution for all epochs)
    op_summaries += operator_summaries(master)
    ctx.log_metrics(operator_metrics(op_summaries), step=max(trained.epochs_run - 1, 0))
    ctx.log_dict({"epochs": trained.history}, "tables/worker_allocation.json")
    ray.get(master.start.remote())   # a run stopped at its target decodes again for inference

    # 3. evaluate: the aggregation on the validation set (a table, the winner tagged: evaluate.py)
    t_phase = time.perf_counter()
    agg, final = fusion(scores, labels, vcfg, seed, ctx)

    phase_s["aggregation"] = time.perf_counter() - t_phase
    t_phase = time.perf_counter()

    #    inference on untrimmed videos: sliding windows, highlights, the winning fusion (inference.py);
    #    their windows came with the training pipeline, or (training stopped early at its target,
    #    or nothing was left to train) through a pipeline of their own
    if videos:
        method = agg["winner"] if vcfg["inference"]["method"] == "winner" else vcfg["inference"]["method"]
        metrics, records = run_inference(videos, classes, models, streams, vcfg, method, agg["fitted"], master, cache,
                                         decoded=trained.after, first_id=len(index.paths), decoded_s=trained.after_s)
        if trained.after is None:
            op_summaries += operator_summaries(master)
            accumulate(cache_totals, ray.get(master.stage_stats.remote(True)))
        ctx.log_dict({"method": method, "videos": records}, "tables/untrimmed_predictions.json")
        final |= metrics
        final |= training_highlight_metrics(records, count)   # highlights vs the true action frames

    phase_s["inference"] = time.perf_counter() - t_phase
    ctx.mark("evaluation")  # the fusion on the validation set, then inference on untrimmed video

    #    the storage trade-off: bytes cached vs bytes of video, and the time the cache saved
    whole_run = operator_metrics(op_summaries)
    # the Ray Data executions the run started (each starts its actor pools): 1 when validation,
    # training and inference rode one pipeline; a run that met its target early decodes again
    ctx.log_params({"video.pipeline_executions": len(op_summaries)})
    ray.get(master.stop.remote())
    bad_at_decode = ray.get(master.bad_files.remote())
    if bad_at_decode:
        ctx.log_dict(bad_at_decode, "tables/bad_files_at_decode.json")
    cached = cache.total_bytes()
    final |= {"cache/mb_cached": cached / 2**20, "cache/mb_video": index.video_bytes / 2**20,
              "cache/cached_to_video_ratio": cached / max(index.video_bytes, 1),
              "cache/hits": float(cache_totals["hits"]), "cache/misses": float(cache_totals["misses"]),
              "cache/time_saved_s": cache_totals["saved_s"],
              "cache/hit_rate": cache_totals["hits"] / max(cache_totals["hits"] + cache_totals["misses"], 1),
              # skipped files by kind (image, audio_only, truncated, ...) and in all, for the summary
              "data/skipped_files": float(len(index.skipped) + len(bad_at_decode)), **skipped_by_kind,
              # the driver process's lifetime peak resident set (Linux reports KiB)
              "memory/driver_rss_mb_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              **{f"memory/{k.split('/', 1)[1]}": v for k, v in whole_run.items()
                 if k in ("pipeline/store_mb_peak", "pipeline/store_limit_mb")},
              "memory/spilled_mb": sum(v for k, v in whole_run.items() if k.endswith("_spilled_mb")),
              **trained.whole_training, **wait_fractions(trained.waits),
              "train/epochs_run": float(trained.epochs_run),
              **({"train/resumed_from_epoch": float(first_epoch)} if first_epoch else {}),  # only a resumed run
              **({"time/to_target_s": trained.time_to_target} if trained.time_to_target is not None else {}),
              "pipeline/shifts_applied": float(trained.shifts_applied), "pipeline/shift_wait_s": trained.shift_wait_s,
              **{f"time/{phase}_s": sec for phase, sec in phase_s.items()}, "val/chance_top1": 1.0 / num_classes,
              **{f"val/{s}_top1": val[f"val/{s}_top1"] for s in streams}}

    # 4. log model and figures (figures.py): confusion, per-stream curves, the pipeline's timeline,
    #    highlights; the MLflow Model (predict.py, docs/models.md)
    figures.log_figures(ctx, classes=classes, labels=labels, fused=agg["fused"], winner=agg["winner"],
                        streams=streams, features=features, phases=phase_s, train_start_s=trained.t_train - t_start,
                        records=records if videos else [], window_frames=count)
    ctx.mark("figures")
    log_model(ctx, models, streams, classes, vcfg, agg["winner"], agg["fitted"])
    ctx.mark("model")
    return final
