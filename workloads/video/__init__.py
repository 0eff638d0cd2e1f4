"""workload=video: the Hierarchical Elastic Video learning system (HEV) as Ray Data stages.

Source: the hierarchical elastic video-learning design notes (docs/papers.md; partly in Chinese). Layers:
video cache/decode (decoder.py, cache.py), feature extraction (extractors.py, stages.py,
pipeline.py), two-stream CNN training (model.py, train.py), fusion (aggregation.py, evaluate.py),
inference on untrimmed video (inference.py), master/bypass control (master.py).
The core calls run.py's ``run`` for mode=train and predict.py's ``predict`` for
mode=predict (orchard/config/registry.py ``entry``). Light on purpose: nothing heavy is
imported here.
"""
from __future__ import annotations

STRATEGIES = ("ring",)


def _pool(cfg: dict, key: str) -> None:
    from orchard.api import require

    require(cfg, key, lambda v: (isinstance(v, int) and v > 0) or
            (len(v) == 2 and 0 < int(v[0]) <= int(v[1])), "a positive int or [min, max] with 0 < min <= max")


def validate(cfg: dict) -> None:
    """Reject a bad ``video.*`` config before Ray starts (raises ``orchard.ConfigError``)."""
    from orchard.api import ConfigError, schema, require, require_choice, require_path

    from .schema import StreamScaling, Synthetic, Video

    v = cfg["video"]
    schema.check(Video, v, "video")  # each key's type and range (workloads/video/schema.py)
    schema.check(StreamScaling, cfg["strategy"], "strategy")  # elastic stream groups
    if v["root"] is None:
        schema.check(Synthetic, v["synthetic"], "video.synthetic")
    require_path(cfg, "video.root", allow_none=True)
    require_path(cfg, "video.split_files", kind="dir", allow_none=True)
    if v["root"] is not None:
        from .layouts import check_classes

        problem = check_classes(v["root"], v.get("split_files"), int(v.get("split") or 1))
        if problem:
            raise ConfigError("video.root", problem)
    require(cfg, "video.streams", lambda s: isinstance(s, dict) and "spatial" in s and len(s) >= 2,
            "a mapping with a spatial stream and at least one temporal stream")
    features = _registered_extractors(v.get("extractor_modules"))
    for stream in v["streams"]:
        require_choice(cfg, f"video.streams.{stream}", features)
    require(cfg, "video.streams.spatial", lambda f: _frames_needed(f, int(v["stack"])) == 1,
            "a single-frame feature (rgb, hog, or a registered extractor whose frames_needed is 1)")
    require(cfg, "video.workers", lambda w: set(w) == set(v["streams"]) and all(int(n) >= 1 for n in w.values()),
            f"one worker count >= 1 per stream ({', '.join(v['streams'])})")
    require(cfg, "video.cpus_per_worker", lambda c: {s for s, n in c.items() if n is not None} <= set(v["streams"]),
            f"CPU shares of the streams' workers, by stream name ({', '.join(v['streams'])})")
    if any(int(n) < int(v["min_workers"]) for n in v["workers"].values()):
        raise ConfigError("video.min_workers", f"at most the smallest video.workers count, got {v['min_workers']}")
    for key in ("decode_concurrency", "extract_concurrency"):
        _pool(cfg, f"video.{key}")
    require_path(cfg, "video.inference.root", kind="dir", allow_none=True)
    if cfg["mode"] == "train" and v.get("resume") is not None:
        require(cfg, "video.resume", lambda _: _has_checkpoint(cfg),
                "null or the folder of a video run that checkpointed an epoch (video_checkpoint.pt in its storage)")


def _has_checkpoint(cfg: dict) -> bool:
    """The previous run's storage holds a video checkpoint (the driver's folder itself may be
    gone: orchard/storage/)."""
    from orchard.api import Storage

    from .checkpoint import CHECKPOINT_NAME

    previous = Storage.previous_run(cfg)
    return previous is not None and previous.exists(CHECKPOINT_NAME)


def resume(cfg: dict, previous_run_dir: str) -> None:
    """``python -m orchard resume <run id>``: train the epochs after that run's last checkpointed one
    (none left: go on from its states to aggregation and inference)."""
    from orchard.api import ConfigError

    if cfg["mode"] != "train":
        raise ConfigError("mode", "train: only a training run has checkpoints to resume from")
    cfg["video"]["resume"] = str(previous_run_dir)
    validate(cfg)


def _registered_extractors(modules) -> list[str]:
    """The extractor table after importing ``video.extractor_modules`` (and entry points)."""
    from orchard.api import ConfigError

    from .extractors import available

    if not isinstance(modules, (list, tuple)) or not all(isinstance(m, str) and m for m in modules):
        raise ConfigError("video.extractor_modules", f"a list of importable module names, got {modules!r}")
    try:
        return available(modules)
    except Exception as exc:  # ImportError, or an error raised by the module while registering
        raise ConfigError("video.extractor_modules",
                          f"importable modules that register extractors; {type(exc).__name__}: {exc}") from None


def _frames_needed(feature: str, stack: int) -> int:
    from .extractors import build_extractor

    return build_extractor(feature, stack=stack).frames_needed(stack)


def resources(cfg: dict):
    """What a run holds in Ray (orchard/cluster/placement.py): each stream's Ray Train workers, in
    placement groups of their own (the streams train at once); inside the run's own reservation,
    the index's 1-CPU probe tasks, then the Ray Data decode and feature pools at their smallest
    (an autoscaling pool grows into what that bundle has spare)."""
    from orchard.api import Resources, bundles

    from .train import trainer_cpus

    def smallest(pool) -> int:  # a pool size: n or [min, max]
        return int(pool) if isinstance(pool, int) else int(pool[0])

    if cfg["mode"] == "predict":  # an actor pool of 1 CPU each, as many as fit (orchard/models/__init__.py)
        return Resources(in_trial=bundles(1, 1.0))
    v, s = cfg["video"], cfg["strategy"]
    stages = len(set(v["streams"].values()))
    pools = smallest(v["decode_concurrency"]) * float(v["decode_cpus"]) \
        + stages * smallest(v["extract_concurrency"]) * float(v["extract_cpus"])
    trainers = tuple(b for stream, n in v["workers"].items()
                     for b in bundles(n, trainer_cpus(cfg, stream), s.get("gpus_per_worker", 0)))
    return Resources(in_trial=bundles(1, max(1.0, pools)), outside=trainers)


def headline(cfg: dict, metrics: dict) -> list[str]:
    """The best fusion of the streams against chance, and each stream alone."""
    fused = {k[len("val/agg_"):-len("_top1")]: v for k, v in metrics.items()
             if k.startswith("val/agg_") and k.endswith("_top1")}
    best = max(fused, key=fused.get)
    streams = ", ".join(f"{k[4:-5]} {v:.3f}" for k, v in sorted(metrics.items())
                        if k.endswith("_top1") and k.startswith("val/") and not k.startswith(("val/agg_", "val/chance")))
    lines = [f"top-1: fused {fused[best]:.3f} ({best}) vs chance {metrics['val/chance_top1']:.3f}; streams alone: {streams}"]
    waits = [f"{k[len('pipeline/'):-len('_trainer_wait_fraction_mean')]} {v:.0%} (worst epoch "
             f"{metrics.get(k[:-len('mean')] + 'max', v):.0%})" for k, v in sorted(metrics.items())
             if k.startswith("pipeline/") and k.endswith("_trainer_wait_fraction_mean")]
    if waits:   # the share of their time the trainers sat waiting for the pipeline (target < 10%)
        lines.append("trainers waited: " + ", ".join(waits))
    return lines


# What the logged model's loader (predict.py) imports: pinned in its requirements (orchard/models/logged.py).
MODEL_IMPORTS = ("torch", "cv2")


def headline_metric(metrics: dict) -> tuple[str, float]:
    """The best fusion's validation top-1 (``headline/fused_top1``)."""
    return "fused_top1", max(v for k, v in metrics.items() if k.startswith("val/agg_") and k.endswith("_top1"))


def dataset(cfg: dict) -> dict:
    """What a train run learns from, for its MLflow dataset input (orchard/tracking/datasets.py)."""
    v = cfg["video"]
    if v["root"]:
        return {"name": f"videos {str(v['root']).rstrip('/').rsplit('/', 1)[-1]}", "path": v["root"]}
    syn = v["synthetic"]
    return {"name": f"synthetic videos {syn['num_classes']}x{syn['videos_per_class']} {syn['size']}px",
            "generator": "workloads.video.synthetic_videos", "settings": {**syn, "seed": cfg["seed"]}}
