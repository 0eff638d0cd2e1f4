"""``workload=video`` end to end: data -> master -> streaming pipeline -> two streams -> fusion -> inference.

Each numbered step is one of the notes' layers: [1] the data (videos stay
videos), [2] the master and the cache layer, [3]-[5] the epochs (decode and
feature stages feeding the CNN training layer, validation, worker shifting), [6]
the aggregation (fusion) layer, [7] inference on untrimmed video, [8] the
storage/caching report.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import wait as wait_futures
from pathlib import Path

import numpy as np

from orchard import skipped

log = logging.getLogger(__name__)


def _prepare_data(cfg: dict, ctx) -> tuple[str, str | None]:
    """The dataset: ``video.root``, or synthetic videos kept in storage; returns (a folder on this
    machine to read the layout from, the storage URI the videos are read from on every node, or
    None when that folder is the one they are read from).

    The synthetic videos live in ``<storage root>/video/data/<settings>`` (``storage.uri``, or
    ``output_dir`` by default: orchard/storage.py), keyed by the generator's settings, so later
    runs and other nodes reuse them."""
    from orchard.storage import Storage

    vcfg = cfg["video"]
    if vcfg.get("root"):
        return vcfg["root"], None
    syn = vcfg["synthetic"]
    difficulty = _difficulty(syn)
    name = f"synthetic_c{syn['num_classes']}_v{syn['videos_per_class']}_s{syn['size']}_f{syn['num_frames']}_seed{cfg['seed']}"
    name += "".join(f"_{k}{v:g}" for k, v in difficulty.items() if v)
    store = Storage.root(cfg).child("video", "data", name)
    if store.is_local:
        _generate(cfg, store.local_path)   # idempotent: files already there are kept
        return str(store.local_path), None
    if not store.complete():   # generate here, then publish the folder (marked complete last)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="orchard-video-") as tmp:
            _generate(cfg, Path(tmp))
            store.upload(tmp)
    return str(store.localize()), store.uri


def _generate(cfg: dict, root: Path) -> None:
    """The synthetic training videos (and, with ``bad_files``, the four bad files) under ``root``."""
    from .synthetic_videos import generate_dataset, write_bad_files

    syn = cfg["video"]["synthetic"]
    generate_dataset(root, syn["num_classes"], syn["videos_per_class"], size=syn["size"],
                     num_frames=syn["num_frames"], seed=int(cfg["seed"]), **_difficulty(syn))
    if syn.get("bad_files"):
        first_class = sorted(p for p in root.iterdir() if p.is_dir())[0]
        write_bad_files(first_class, next(first_class.glob("*.mp4")))


def _difficulty(syn: dict) -> dict[str, float]:
    """The generator's difficulty knobs (synthetic_videos.py); absent keys mean off."""
    return {k: float(syn.get(k) or 0.0) for k in ("appearance_cue", "noise", "shake")}


def _val_features(segments: list[dict], features: list[str], index, vcfg: dict, master, cache):
    """The validation segments' features, computed once (decode once, every feature) and kept."""
    from .pipeline import consume

    cols = [*features, "video", "label", "segment"]
    parts = {c: [] for c in cols}
    ds = _dataset(segments, features, index, vcfg, master, cache)
    for b, _ in consume(ds, 64, cols):
        for c in cols:
            parts[c].append(b[c])
    data = {c: np.concatenate(v) for c, v in parts.items()}
    order = np.lexsort((data["segment"], data["video"]))
    return {c: v[order] for c, v in data.items()}


def _dataset(segments, features, index, vcfg, master, cache):
    from .pipeline import build_dataset

    return build_dataset(segments, features, index.paths, index.lengths, vcfg, master, cache,
                         pts=index.pts, digests=index.digests)


def _score_states(states: dict[str, bytes], streams: dict, val: dict, num_classes: int, vcfg: dict):
    """Each stream's eval model from its state bytes, scored on the validation features:
    ``(models, scores, labels, losses, val metrics)`` (see ``_val_scores``)."""
    from .aggregation import topk_accuracy
    from .train import load_model

    models = {s: load_model(states[s], spec["in_channels"], num_classes, vcfg["widths"], vcfg["dropout"])
              for s, spec in streams.items()}
    scores, labels, losses = _val_scores(models, streams, val, num_classes, int(vcfg["val_segments"]))
    metrics = {f"val/{s}_loss": losses[s] for s in streams}
    metrics |= {f"val/{s}_top1": topk_accuracy(scores[s].mean(1), labels, 1) for s in streams}
    return models, scores, labels, losses, metrics


def _val_scores(models: dict, streams: dict, val: dict, num_classes: int, per_video: int):
    """Validation probabilities per stream (V, K, C), labels (V,), mean loss per stream.

    Only videos with all ``per_video`` segments are kept, so a segment dropped by the
    decode stage (a file that broke) cannot misalign videos.
    """
    from .train import predict

    ids, counts = np.unique(val["video"], return_counts=True)
    rows = np.isin(val["video"], ids[counts == per_video])
    n = int((counts == per_video).sum())
    labels = val["label"][rows].reshape(n, per_video)[:, 0]
    scores, losses = {}, {}
    for stream, spec in streams.items():
        probs = predict(models[stream], val[spec["feature"]][rows])
        scores[stream] = probs.reshape(n, per_video, num_classes)
        losses[stream] = float(-np.log(probs[np.arange(len(probs)), val["label"][rows]] + 1e-9).mean())
    return scores, labels, losses


def run(cfg: dict, ctx) -> dict[str, float]:
    from .operator_metrics import pipeline_budget

    with pipeline_budget(cfg["video"].get("object_store_mb")):
        return _run(cfg, ctx)


def cache_dir(cfg: dict):
    """The frame-index store and disk cache (an ``orchard.storage.Storage``): ``video.cache_dir``,
    or ``<storage root>/video/cache`` (``storage.uri``, else ``output_dir``): shared by every run
    on that storage, and by every node."""
    from orchard.storage import Storage

    return Storage(cfg["video"].get("cache_dir") or Storage.root(cfg).child("video", "cache"))


def _run(cfg: dict, ctx) -> dict[str, float]:
    import resource

    import ray

    from orchard.errors import ConfigError
    from orchard.storage import Storage

    from . import aggregation, figures
    from .cache import make_cache
    from .checkpoint import load_checkpoint, save_checkpoint
    from .data import classes_problem, scan
    from .extractors import load_modules
    from .feeder import Feeder, make_queues, shutdown_queues
    from .inference import run_inference
    from .master import evenly_spaced_segments, start_master
    from .operator_metrics import operator_metrics
    from .pipeline import frame_count, stage_metrics
    from .train import launch_streams, shift_workers, stream_channels

    ray.data.DataContext.get_current().enable_progress_bars = False
    vcfg, t_start = cfg["video"], time.perf_counter()
    seed = int(cfg["seed"])
    modules = list(vcfg.get("extractor_modules") or [])
    load_modules(modules)
    store = cache_dir(cfg)

    # [1] data: index the videos (frame pts, read once and kept), set non-videos aside (counted by kind)
    root, storage_uri = _prepare_data(cfg, ctx)
    index = scan(root, float(vcfg["val_fraction"]), seed, decoder=vcfg["decoder"], index_dir=store.child("index").uri,
                 split_files=vcfg.get("split_files"), split=int(vcfg.get("split") or 1), storage_uri=storage_uri,
                 index_max_mb=vcfg.get("index_max_mb"))
    problem = classes_problem(index.classes, lambda c: index.classes.index(c) in index.labels, root)
    if problem:
        raise ConfigError("video.root", problem)
    train_ids, val_ids = index.subset("train"), index.subset("val")
    if not train_ids or not val_ids:
        raise ConfigError("video.root", f"training and validation videos; found {len(train_ids)} and "
                          f"{len(val_ids)} in {root}")
    classes, num_classes = index.classes, len(index.classes)
    ctx.log_params({"video.root_used": storage_uri or root, "video.classes": ",".join(classes), "video.layout": index.layout})
    ctx.log_dict({"files": index.skipped, "kinds": index.skipped_kinds}, "tables/skipped_files.json")
    # the bad-data policy shared by the workloads (orchard/skipped.py): named, counted by kind, skipped.csv
    set_aside = [skipped.SkippedFile(Path(p).name, index.skipped_kinds.get(p, "unreadable"), r)
                 for p, r in index.skipped.items()]
    skipped_by_kind = {k: v for k, v in skipped.report(ctx, set_aside, "video").items() if k != "data/skipped_files"}
    ctx.log_metrics({"data/videos": len(index.paths), "data/train_videos": len(train_ids),
                     "data/val_videos": len(val_ids), "data/skipped_files": len(index.skipped),
                     "data/index_reused": index.index_reused, "cache/index_pruned": index.index_pruned,
                     "data/video_mb": index.video_bytes / 2**20, **skipped_by_kind})
    if index.skipped:
        ctx.set_tags({"video.skipped_files": "; ".join(f"{Path(p).name}: {r[:60]}" for p, r in index.skipped.items())[:4000]})

    phase_s = {"data": time.perf_counter() - t_start, "train": 0.0, "val": 0.0}

    # [2] the master (sampler, control, monitor) and the cache layer
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
    run_storage = Storage.for_run(cfg, ctx.run_dir)
    resumed = load_checkpoint(Storage.for_run(cfg, vcfg["resume"])) if vcfg.get("resume") else None
    first_epoch = 0 if resumed is None else epochs if resumed["training_done"] else int(resumed["epoch"]) + 1
    alloc = dict(resumed["alloc"]) if resumed else {s: int(n) for s, n in vcfg["workers"].items()}
    history, op_summaries = list(resumed["history"]) if resumed else [], []
    if resumed:  # at once: it says what this run is while it trains (and again with the final metrics)
        ctx.log_metrics({"train/resumed_from_epoch": float(first_epoch)})
    cache_totals = {"hits": 0, "misses": 0, "saved_s": 0.0}

    # [3] the validation segments' features, once: every epoch scores the streams on the same arrays
    t_phase = time.perf_counter()
    val_data = _val_features(val_segments, features, index, vcfg, master, cache)
    _accumulate(cache_totals, ray.get(master.stage_stats.remote(True)))
    op_summaries += ray.get(master.operator_summaries.remote(True))
    phase_s["val"] += time.perf_counter() - t_phase

    # [4] the master draws each epoch's class-balanced segment seeds (a pure function of the seed
    #     and the epoch); one pipeline carries them all. A resumed run draws only the epochs after
    #     its checkpoint's: no epoch is trained twice
    states: dict[str, bytes] = dict(resumed["states"]) if resumed else {}
    steps: dict[str, int] = dict(resumed["steps"]) if resumed else {}
    history_waits = {s: list(w) for s, w in resumed["waits"].items()} if resumed else {}
    train_stats: dict[str, dict] = {}   # every stage's counters over the whole training
    epochs_run, time_to_target = first_epoch, None
    shifts_applied, shift_wait_s = 0, 0.0   # worker shifts applied (video.shift_apply), and their cost
    target = vcfg.get("target_top1")
    t_train = time.perf_counter()
    if first_epoch < epochs:
        segments = []
        for epoch in range(first_epoch, epochs):
            drawn = ray.get(master.epoch_segments.remote(train_ids, int(vcfg["clips_per_epoch"]), count, epoch,
                                                         int(vcfg["offset_stride"])))
            segments += [{**seg, "epoch": epoch} for seg in drawn]
        # no select_columns: its projection is a 1-CPU Ray Data task of its own, which a cluster
        # whose CPUs the streams and pools hold never schedules (the run stalls); the feeder
        # takes only the columns it deals
        train_ds = _dataset(segments, features, index, vcfg, master, cache)
        queues = make_queues(alloc, int(vcfg["queue_depth"]))
        results = make_queues({"results": 1}, 0)["results"][0]
        feeder = Feeder({s: spec["feature"] for s, spec in streams.items()}, queues, int(vcfg["batch_size"]), epochs,
                        first_epoch=first_epoch, master=master if vcfg.get("pause_decode", True) else None)

        # [5] one Ray Train run per stream for the whole training, the feeder dealing them the pipeline
        t_window = time.perf_counter()
        feeding = feeder.start(train_ds.iter_batches(batch_size=int(vcfg["pipeline_batch"]), batch_format="numpy"))
        runs = launch_streams(streams, alloc, queues, results, cfg, ctx, resumed)
        done: dict[int, dict] = {}
        shift: dict | None = None   # a worker shift the feeder applies from shift["epoch"] on
        generation = 0              # relaunches so far: each relaunched Train run gets a new name
        try:
            for epoch in range(first_epoch, epochs):
                while len(done.get(epoch, {})) < len(streams):
                    item = _next_result(results, runs, feeder)
                    if "diverged" in item:   # a stream's loss or weights went non-finite: the run ends
                        raise _diverged(item, run_storage, ctx)
                    done.setdefault(item["epoch"], {})[item["stream"]] = item
                for s, item in done[epoch].items():
                    states[s], steps[s] = item["state"], int(item["steps"])
                    history_waits.setdefault(s, []).append(item["metrics"][f"pipeline/{s}_trainer_wait_fraction"])
                window = time.perf_counter() - t_window
                t_window = time.perf_counter()
                stats = ray.get(master.stage_stats.remote(True))
                _accumulate(cache_totals, stats)
                _merge_stats(train_stats, stats)
                pipe = stage_metrics(stats, window)
                # [6] validation per stream (the trainers go on with the next epoch meanwhile)
                t_val = time.perf_counter()
                models, scores, labels, losses, val = _score_states(states, streams, val_data, num_classes, vcfg)
                phase_s["val"] += time.perf_counter() - t_val
                # the notes' rule, evaluated every epoch; applied (video.shift_apply) from the next
                # epoch the feeder has not begun to deal, else logged only (docs/video.md)
                proposed, reason = shift_workers(alloc, losses, float(vcfg["shift_ratio"]), int(vcfg["min_workers"]))
                if vcfg.get("shift_apply") and proposed != alloc and shift is None:
                    changed = {s: n for s, n in proposed.items() if n != alloc[s]}
                    at = feeder.request_resize(changed)
                    if at is not None:
                        shift = {"epoch": at, "alloc": changed}
                        reason += f"; applied from epoch {at + 1}"
                history.append({"epoch": epoch, "workers": dict(alloc), "val_loss": losses, "shift_rule": reason})
                epochs_run = epoch + 1
                fused = aggregation.topk_accuracy(np.mean([scores[s].mean(1) for s in streams], axis=0), labels, 1)
                met = target is not None and fused >= target
                # [6a] the epoch's checkpoint in the run storage, before its metrics: an epoch whose
                #      figures are logged is one a resume will not train again (checkpoint.py)
                save_checkpoint(run_storage, epoch, states, steps, alloc, history, history_waits,
                                training_done=met or epoch + 1 == epochs)
                clips = len(streams) * int(vcfg["clips_per_epoch"])
                ctx.log_metrics({**pipe, **val, **{f"alloc/{s}_workers": n for s, n in alloc.items()},
                                 "pipeline/feeder_wait_pipeline_s": feeder.wait_pipeline_s,
                                 "pipeline/feeder_wait_trainers_s": feeder.wait_trainers_s,
                                 "pipeline/decode_pauses": float(feeder.pauses),
                                 "pipeline/decode_paused_s": feeder.paused_s,
                                 "throughput/pipeline_clips_per_s": clips / max(window, 1e-9),
                                 "time/epoch_s": window}, step=epoch)
                ctx.progress(epoch + 1, epochs, desc=f"epoch {epoch + 1}",
                             **{f"{s} val top1": val[f"val/{s}_top1"] for s in streams})
                if met and epoch + 1 < epochs:
                    # [6b] target met: the master stops decoding (the stages drop what is left) and
                    #      the trainers stop at their next batch; the last validated states are kept
                    time_to_target = time.perf_counter() - t_train
                    ray.get(master.stop.remote())
                    feeder.finish.set()
                    break
                if met and time_to_target is None:
                    time_to_target = time.perf_counter() - t_train
                if shift is not None and shift["epoch"] == epoch + 1:
                    # [6c] the shifted streams' runs end at the feeder's resize mark after this
                    #      epoch; relaunch them with their new worker counts from its states
                    generation += 1
                    new_queues = _relaunch_shifted(shift["alloc"], streams, alloc, runs, queues, results,
                                                   states, steps, epoch, int(vcfg["queue_depth"]), cfg, ctx,
                                                   generation)
                    feeder.hand_over(new_queues)
                    shifts_applied, shift = shifts_applied + 1, None
            for s, fut in runs.items():
                fut.result()
        finally:
            feeder.stop.set()
            if any(not f.done() for f in runs.values()) or feeder.error:
                try:   # unblock trainers of a failed or interrupted run; never mask why it stopped
                    shutdown_queues({**queues, "results": [results]})
                except Exception as exc:
                    log.warning("video: queues not shut down cleanly: %s", exc)
                # the streams' Train runs end once their queues are gone (train.py's workers
                # return); the run lifecycle waits for their threads before Ray stops
                # (orchard/background.py)
            wait_futures([feeding], timeout=30)  # the lifecycle waits for it too, before Ray stops
            shift_wait_s = feeder.resize_wait_s
        shutdown_queues({**queues, "results": [results]})
    else:
        # [5'] resumed after its last epoch (stopped in aggregation or inference): nothing to train,
        #      the checkpointed states go on to aggregation and inference
        models, scores, labels, losses, val = _score_states(states, streams, val_data, num_classes, vcfg)
    phase_s["train"] = time.perf_counter() - t_train
    # the pipeline runs ahead of the epochs (bounded by the queues): its busy fractions over the
    # whole training say more than per-epoch windows in which it may have had nothing left to do
    whole_training = {k.replace("pipeline/", "pipeline/train_", 1): v
                      for k, v in stage_metrics(train_stats, phase_s["train"]).items()
                      if k.endswith(("_busy_fraction", "_items_per_s", "frames_per_s"))}
    # Ray Data's own per-operator figures of the training pipeline (one execution for all epochs)
    op_summaries += _operator_summaries(master)
    ctx.log_metrics(operator_metrics(op_summaries), step=max(epochs_run - 1, 0))
    ctx.log_dict({"epochs": history}, "tables/worker_allocation.json")
    ray.get(master.start.remote())   # a run stopped at its target decodes again for inference
    # [7] aggregation on the validation set: a table, the winner tagged
    t_phase = time.perf_counter()
    acfg = vcfg["aggregation"]
    agg = aggregation.evaluate(scores, labels, topk=int(acfg["topk"]), n_folds=int(acfg["folds"]), seed=seed,
                               attention_steps=int(acfg["attention_steps"]))
    ctx.log_dict({"table": agg["table"], "winner": agg["winner"],
                  "linear_weights": agg["fitted"]["linear_weights"]}, "tables/aggregation.json")
    ctx.log_text(_markdown_table(agg["table"], agg["winner"]), "tables/aggregation.md")
    ctx.set_tags({"video.aggregation_winner": agg["winner"]})
    final = {f"val/agg_{r['method']}_top1": r["top1"] for r in agg["table"]}
    final |= {f"val/agg_{r['method']}_top5": r["top5"] for r in agg["table"] if "top5" in r}
    final |= {f"val/agg_{r['method']}_log_loss": r["log_loss"] for r in agg["table"]}

    phase_s["aggregation"] = time.perf_counter() - t_phase
    t_phase = time.perf_counter()

    # [8] inference on untrimmed videos: sliding windows, highlights, the winning fusion
    videos = _untrimmed_videos(cfg, classes, run_storage.child("untrimmed"))
    if videos:
        method = agg["winner"] if vcfg["inference"]["method"] == "winner" else vcfg["inference"]["method"]
        metrics, records = run_inference(videos, classes, models, streams, vcfg, method, agg["fitted"], master, cache)
        op_summaries += ray.get(master.operator_summaries.remote(True))
        _accumulate(cache_totals, ray.get(master.stage_stats.remote(True)))
        ctx.log_dict({"method": method, "videos": records}, "tables/untrimmed_predictions.json")
        final |= metrics
        from .predict import training_highlight_metrics
        final |= training_highlight_metrics(records, count)   # highlights vs the true action frames

    phase_s["inference"] = time.perf_counter() - t_phase

    # [9] the storage trade-off: bytes cached vs bytes of video, and the time the cache saved
    whole_run = operator_metrics(op_summaries)
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
              **whole_training, **_wait_fractions(history_waits),
              "time/total_s": time.perf_counter() - t_start, "train/epochs_run": float(epochs_run),
              **({"train/resumed_from_epoch": float(first_epoch)} if first_epoch else {}),  # only a resumed run
              **({"time/to_target_s": time_to_target} if time_to_target is not None else {}),
              "alloc/shifts_applied": float(shifts_applied), "alloc/shift_wait_s": shift_wait_s,
              **{f"time/{phase}_s": sec for phase, sec in phase_s.items()}, "val/chance_top1": 1.0 / num_classes,
              **{f"val/{s}_top1": val[f"val/{s}_top1"] for s in streams}}
    # [10] figures (figures.py): confusion, per-stream curves, the pipeline's timeline, highlights
    figures.log_figures(ctx, classes=classes, labels=labels, fused=agg["fused"], winner=agg["winner"],
                        streams=streams, features=features, phases=phase_s, train_start_s=t_train - t_start,
                        records=records if videos else [], window_frames=count)
    from .predict import log_model
    log_model(ctx, models, streams, classes, vcfg, agg["winner"], agg["fitted"])  # the MLflow Model (docs/models.md)
    return final


def _operator_summaries(master, wait_s: float = 5.0) -> list[dict]:
    """The probe summaries the master holds (reset); waits briefly for the fire-and-forget report."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        got = ray.get(master.operator_summaries.remote(True))
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _relaunch_shifted(changed: dict[str, int], streams: dict, alloc: dict, runs: dict, queues: dict, results,
                      states: dict, steps: dict, epoch: int, depth: int, cfg: dict, ctx, generation: int) -> dict:
    """Wait for the shifted streams' runs to end (at their resize mark), then start each again
    with its new worker count from its state after ``epoch``; updates ``alloc``, ``runs`` and
    ``queues`` in place and returns the new queues for the feeder."""
    from orchard import background

    from .feeder import make_queues, shutdown_queues
    from .train import launch_streams

    old = [runs[s] for s in changed]
    background.wait(old)
    for fut in old:
        fut.result()  # a run that failed instead of ending at the mark fails the run here
    shutdown_queues({s: queues[s] for s in changed})
    alloc.update(changed)
    new_queues = make_queues(changed, depth)
    queues.update(new_queues)
    resumed = {"states": states, "steps": steps, "epoch": epoch}
    runs.update(launch_streams({s: streams[s] for s in changed}, alloc, new_queues, results, cfg, ctx, resumed,
                               generation=generation))
    return new_queues


def _next_result(results, runs: dict, feeder) -> dict:
    """The next end-of-epoch state from a stream's rank 0; raises if a run or the feeder failed."""
    from ray.util.queue import Empty

    while True:
        try:
            return results.get(block=True, timeout=1.0)
        except Empty:
            pass
        if feeder.error is not None:
            raise RuntimeError(f"video pipeline failed: {type(feeder.error).__name__}: {feeder.error}") \
                from feeder.error
        for fut in runs.values():
            if fut.done():
                fut.result()   # raises the run's error, if it failed
        if all(fut.done() for fut in runs.values()):
            try:   # handed over just before its run ended (a stream that diverged)
                return results.get(block=False)
            except Empty:
                raise RuntimeError("the streams' training ended before handing over every epoch") from None


def _diverged(item: dict, run_storage, ctx):
    """The run's ``Diverged`` from a stream's hand-over (train.py), ``train/diverged_at_step``
    logged; its ``checkpoint`` says whether an epoch's checkpoint (all finite) is there to resume."""
    from orchard import divergence
    from orchard.errors import Diverged

    from .checkpoint import CHECKPOINT_NAME

    err = Diverged(**item["diverged"])
    err.checkpoint = run_storage.exists(CHECKPOINT_NAME)
    divergence.log(ctx, err)
    return err


def _merge_stats(total: dict, window: dict) -> None:
    """Add one window's per-stage counters (master.stage_stats) into ``total``."""
    for stage, st in window.items():
        acc = total.setdefault(stage, {"actors": 0})
        for k, v in st.items():
            if k == "actors":
                acc["actors"] = max(acc["actors"], v)
            elif isinstance(v, (int, float)) and k not in ("first", "last"):
                acc[k] = acc.get(k, 0) + v


def _wait_fractions(waits: dict[str, list[float]]) -> dict[str, float]:
    """Mean trainer wait fraction per stream over the epochs (the issue's < 25% target)."""
    return {f"pipeline/{s}_trainer_wait_fraction_mean": float(np.mean(v)) for s, v in waits.items() if v}


def _accumulate(totals: dict, stats: dict) -> None:
    for s in stats.values():
        for k in ("hits", "misses", "saved_s"):
            totals[k] += s.get(k, 0)


def _untrimmed_videos(cfg: dict, classes: list[str], storage) -> list[dict]:
    """Untrimmed videos to classify: ``video.inference.root`` (class folders) or synthetic ones,
    written to the run's storage (``storage``: its ``untrimmed`` folder) and named there, so the
    decode stages read them on any node."""
    import tempfile

    from .data import scan
    from .synthetic_videos import MOTION_CLASSES, generate_untrimmed

    vcfg, icfg = cfg["video"], cfg["video"]["inference"]
    if icfg.get("root"):
        found = scan(icfg["root"], val_fraction=0.0, decoder=vcfg["decoder"])
        return [{"path": p, "label": found.classes[lab], "length": n, "pts": pts}
                for p, lab, n, pts in zip(found.paths, found.labels, found.lengths, found.pts)]
    if int(icfg["videos"]) <= 0 or not set(classes) <= set(MOTION_CLASSES):
        return []  # real training data with no untrimmed videos given: nothing to classify
    seed = int(cfg["seed"])
    with tempfile.TemporaryDirectory(prefix="orchard-untrimmed-") as tmp:
        folder = storage.local_path if storage.is_local else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        videos = [generate_untrimmed(folder / f"untrimmed_{i}.mp4", classes[i % len(classes)],
                                     seed=10_000 + seed * 97 + i, size=int(vcfg["synthetic"]["size"]),
                                     background_frames=int(icfg["background_frames"]),
                                     action_frames=int(icfg["action_frames"]), **_difficulty(vcfg["synthetic"]))
                  for i in range(int(icfg["videos"]))]
        if not storage.is_local:
            for video in videos:
                name = Path(video["path"]).name
                storage.write_bytes(name, Path(video["path"]).read_bytes())
                video["path"] = f"{storage.uri}/{name}"
    return videos


def _markdown_table(table: list[dict], winner: str) -> str:
    has5 = any("top5" in r for r in table)
    lines = ["| method | top-1 |" + (" top-5 |" if has5 else "") + " log-loss |",
             "|---|---|" + ("---|" if has5 else "") + "---|"]
    for r in table:
        name = f"**{r['method']}** (winner)" if r["method"] == winner else r["method"]
        lines.append(f"| {name} | {r['top1']:.3f} |" + (f" {r['top5']:.3f} |" if has5 else "")
                     + f" {r['log_loss']:.3f} |")
    lines.append("\nWinner: highest top-1, then top-5, then lowest log-loss, then the order above.")
    return "\n".join(lines) + "\n"
