"""``workload=video`` end to end: data -> master -> streaming pipeline -> two streams -> fusion -> inference.

Each numbered step is one of the notes' layers: [1] the data (videos stay
videos), [2] the master and the cache layer, [3]-[5] the epochs (decode and
feature stages feeding the CNN training layer, validation, worker shifting), [6]
the aggregation (fusion) layer, [7] inference on untrimmed video, [8] the
storage/caching report.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def _prepare_data(cfg: dict, ctx) -> tuple[str, dict]:
    """The dataset root: ``video.root`` or synthetic videos generated under the output folder."""
    from .synthetic_videos import generate_dataset, write_bad_files

    vcfg = cfg["video"]
    if vcfg.get("root"):
        return vcfg["root"], {}
    syn = vcfg["synthetic"]
    # Keyed by the generator's settings so later runs reuse the files.
    difficulty = _difficulty(syn)
    name = f"synthetic_c{syn['num_classes']}_v{syn['videos_per_class']}_s{syn['size']}_f{syn['num_frames']}_seed{cfg['seed']}"
    name += "".join(f"_{k}{v:g}" for k, v in difficulty.items() if v)
    root = Path(cfg["output_dir"]) / "video" / "data" / name
    generate_dataset(root, syn["num_classes"], syn["videos_per_class"], size=syn["size"],
                     num_frames=syn["num_frames"], seed=int(cfg["seed"]), **difficulty)
    bad = {}
    if syn.get("bad_files"):
        first_class = sorted(p for p in root.iterdir() if p.is_dir())[0]
        bad = write_bad_files(first_class, next(first_class.glob("*.mp4")))
    return str(root), bad


def _difficulty(syn: dict) -> dict[str, float]:
    """The generator's difficulty knobs (synthetic_videos.py); absent keys mean off."""
    return {k: float(syn.get(k) or 0.0) for k in ("appearance_cue", "noise", "shake")}


def _val_scores(models: dict, streams: dict, datasets: dict, num_classes: int, per_video: int):
    """Validation probabilities per stream (V, K, C), labels (V,), mean loss per stream.

    Only videos with all ``per_video`` segments in every stream are kept, so a
    segment dropped by the decode stage (a file that broke) cannot misalign streams.
    """
    from .pipeline import collect
    from .train import predict

    raw = {}
    for stream, spec in streams.items():
        feats, meta = collect(datasets[stream], spec["feature"], ("video", "label", "segment"))
        order = np.lexsort((meta["segment"], meta["video"]))
        raw[stream] = (predict(models[stream], feats)[order], meta["video"][order], meta["label"][order])
    complete = None
    for _, videos, _ in raw.values():
        ids, counts = np.unique(videos, return_counts=True)
        ok = set(ids[counts == per_video].tolist())
        complete = ok if complete is None else complete & ok
    keep_ids = sorted(complete)
    scores, losses, labels = {}, {}, None
    for stream, (probs, videos, labs) in raw.items():
        rows = np.isin(videos, keep_ids)
        scores[stream] = probs[rows].reshape(len(keep_ids), per_video, num_classes)
        losses[stream] = float(-np.log(probs[rows, labs[rows]] + 1e-9).mean())
        labels = labs[rows].reshape(len(keep_ids), per_video)[:, 0]
    return scores, labels, losses


def run(cfg: dict, ctx) -> dict[str, float]:
    from .operator_metrics import pipeline_budget

    with pipeline_budget(cfg["video"].get("object_store_mb")):
        return _run(cfg, ctx)


def _run(cfg: dict, ctx) -> dict[str, float]:
    import resource

    import ray

    from . import aggregation
    from .cache import make_cache
    from .dataset import scan
    from .inference import run_inference
    from .master import evenly_spaced_segments, start_master
    from .operator_metrics import operator_metrics
    from .pipeline import build_dataset, frame_count, stage_metrics
    from .train import fit_streams, load_model, shift_workers, stream_channels

    ray.data.DataContext.get_current().enable_progress_bars = False
    vcfg, t_start = cfg["video"], time.perf_counter()
    seed = int(cfg["seed"])

    # [1] data: index the videos, set bad files aside (counted and named)
    root, _ = _prepare_data(cfg, ctx)
    index = scan(root, float(vcfg["val_fraction"]), seed, decoder=vcfg["decoder"])
    train_ids, val_ids = index.subset("train"), index.subset("val")
    if not train_ids or not val_ids:
        raise RuntimeError(f"{root}: need training and validation videos, found {len(train_ids)} and {len(val_ids)}")
    classes, num_classes = index.classes, len(index.classes)
    ctx.log_params({"video.root_used": root, "video.classes": ",".join(classes)})
    ctx.log_dict(index.skipped, "tables/skipped_files.json")
    ctx.log_metrics({"data/videos": len(index.paths), "data/train_videos": len(train_ids),
                     "data/val_videos": len(val_ids), "data/skipped_files": len(index.skipped),
                     "data/video_mb": index.video_bytes / 2**20})
    if index.skipped:
        ctx.set_tags({"video.skipped_files": "; ".join(f"{Path(p).name}: {r[:60]}" for p, r in index.skipped.items())[:4000]})

    phase_s = {"data": time.perf_counter() - t_start, "train": 0.0, "val": 0.0}

    # [2] the master (sampler, control, monitor) and the cache layer
    master = start_master(index.labels, index.lengths, seed)
    cache = make_cache(vcfg["cache"], ctx.run_dir, float(vcfg["cache_max_mb"]))
    streams = {s: {"feature": f, "num_classes": num_classes,
                   "in_channels": stream_channels(f, int(vcfg["stack"]), vcfg["extractor_options"], int(vcfg["size"]))}
               for s, f in vcfg["streams"].items()}
    count = frame_count([s["feature"] for s in streams.values()], int(vcfg["stack"]))
    val_segments = evenly_spaced_segments(index.labels, index.lengths, val_ids, int(vcfg["val_segments"]), count)
    alloc = {s: int(n) for s, n in vcfg["workers"].items()}
    states, steps, history = {}, {}, []
    cache_totals = {"hits": 0, "misses": 0, "saved_s": 0.0}
    op_summaries = []

    for epoch in range(int(vcfg["epochs"])):
        # [3] the master draws the epoch's class-balanced segment seeds before it begins
        t_epoch = time.perf_counter()
        segments = ray.get(master.epoch_segments.remote(train_ids, int(vcfg["clips_per_epoch"]), count, epoch,
                                                        int(vcfg["offset_stride"])))
        # only the stream's feature and the label travel to its trainers
        train_sets = {s: build_dataset(segments, [spec["feature"]], index.paths, index.lengths, vcfg, master,
                                       cache).select_columns([spec["feature"], "label"])
                      for s, spec in streams.items()}
        # [4] each stream trains on its own feature with its own worker count
        results = fit_streams(streams, alloc, train_sets, states, steps, epoch, cfg, ctx,
                              bool(vcfg["concurrent_streams"]))
        train_wall = time.perf_counter() - t_epoch
        phase_s["train"] += train_wall
        train_stats = ray.get(master.stage_stats.remote(True))
        _accumulate(cache_totals, train_stats)
        pipe = stage_metrics(train_stats, train_wall)
        # Ray Data's own per-operator queues, store use and backpressure for the epoch's training
        train_ops = ray.get(master.operator_summaries.remote(True))
        pipe |= operator_metrics(train_ops)
        op_summaries += train_ops
        for s, (state, n_steps) in results.items():
            states[s], steps[s] = state, n_steps
        # [5] validation per stream, then the worker-shifting rule
        models = {s: load_model(states[s], spec["in_channels"], num_classes, vcfg["widths"], vcfg["dropout"])
                  for s, spec in streams.items()}
        val_sets = {s: build_dataset(val_segments, [spec["feature"]], index.paths, index.lengths, vcfg, master, cache)
                    for s, spec in streams.items()}
        scores, labels, losses = _val_scores(models, streams, val_sets, num_classes, int(vcfg["val_segments"]))
        # validation traffic counts for the cache, not for training throughput
        _accumulate(cache_totals, ray.get(master.stage_stats.remote(True)))
        op_summaries += ray.get(master.operator_summaries.remote(True))
        val = {f"val/{s}_loss": losses[s] for s in streams}
        val |= {f"val/{s}_top1": aggregation.topk_accuracy(scores[s].mean(1), labels, 1) for s in streams}
        epoch_s = time.perf_counter() - t_epoch
        phase_s["val"] += epoch_s - train_wall
        clips = len(segments) * len(streams)
        ctx.log_metrics({**pipe, **val, **{f"alloc/{s}_workers": n for s, n in alloc.items()},
                         "throughput/pipeline_clips_per_s": clips / max(train_wall, 1e-9),
                         "time/epoch_s": epoch_s}, step=epoch)
        new_alloc, reason = shift_workers(alloc, losses, float(vcfg["shift_ratio"]), int(vcfg["min_workers"]))
        history.append({"epoch": epoch, "workers": dict(alloc), "val_loss": losses, "shift": reason})
        alloc = new_alloc
        ctx.progress(epoch + 1, int(vcfg["epochs"]), desc=f"epoch {epoch + 1}",
                     **{f"{s} val top1": val[f"val/{s}_top1"] for s in streams})
    ctx.log_dict({"epochs": history}, "tables/worker_allocation.json")

    # [6] aggregation on the validation set: a table, the winner tagged
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

    # [7] inference on untrimmed videos: sliding windows, highlights, the winning fusion
    videos = _untrimmed_videos(cfg, classes, Path(ctx.run_dir) / "untrimmed")
    if videos:
        method = agg["winner"] if vcfg["inference"]["method"] == "winner" else vcfg["inference"]["method"]
        metrics, records = run_inference(videos, classes, models, streams, vcfg, method, agg["fitted"], master, cache)
        _accumulate(cache_totals, ray.get(master.stage_stats.remote(True)))
        ctx.log_dict({"method": method, "videos": records}, "tables/untrimmed_predictions.json")
        final |= metrics

    phase_s["inference"] = time.perf_counter() - t_phase

    # [8] the storage trade-off: bytes cached vs bytes of video, and the time the cache saved
    op_summaries += ray.get(master.operator_summaries.remote(True))  # validation and inference
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
              "data/skipped_files": float(len(index.skipped) + len(bad_at_decode)),
              # the driver process's lifetime peak resident set (Linux reports KiB)
              "memory/driver_rss_mb_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              **{f"memory/{k.split('/', 1)[1]}": v for k, v in whole_run.items()
                 if k in ("pipeline/store_mb_peak", "pipeline/store_limit_mb")},
              "memory/spilled_mb": sum(v for k, v in whole_run.items() if k.endswith("_spilled_mb")),
              "time/total_s": time.perf_counter() - t_start,
              **{f"time/{phase}_s": sec for phase, sec in phase_s.items()}, "val/chance_top1": 1.0 / num_classes,
              **{f"val/{s}_top1": val[f"val/{s}_top1"] for s in streams}}
    return final


def _accumulate(totals: dict, stats: dict) -> None:
    for s in stats.values():
        for k in ("hits", "misses", "saved_s"):
            totals[k] += s.get(k, 0)


def _untrimmed_videos(cfg: dict, classes: list[str], folder: Path) -> list[dict]:
    """Untrimmed videos to classify: ``video.inference.root`` (class folders) or synthetic ones."""
    from .dataset import scan
    from .synthetic_videos import MOTION_CLASSES, generate_untrimmed

    vcfg, icfg = cfg["video"], cfg["video"]["inference"]
    if icfg.get("root"):
        found = scan(icfg["root"], val_fraction=0.0, decoder=vcfg["decoder"])
        return [{"path": p, "label": found.classes[lab], "length": n}
                for p, lab, n in zip(found.paths, found.labels, found.lengths)]
    if int(icfg["videos"]) <= 0 or not set(classes) <= set(MOTION_CLASSES):
        return []  # real training data with no untrimmed videos given: nothing to classify
    folder.mkdir(parents=True, exist_ok=True)
    seed = int(cfg["seed"])
    return [generate_untrimmed(folder / f"untrimmed_{i}.mp4", classes[i % len(classes)],
                               seed=10_000 + seed * 97 + i, size=int(vcfg["synthetic"]["size"]),
                               background_frames=int(icfg["background_frames"]),
                               action_frames=int(icfg["action_frames"]), **_difficulty(vcfg["synthetic"]))
            for i in range(int(icfg["videos"]))]


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
