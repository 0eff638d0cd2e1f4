"""workload=forest: the Kinect body-part decision forest trained in distributed rounds.

Source: Budiu, Shotton, Murray, Finocchio, "Parallelizing the Training of the Kinect
Body Parts Labeling Algorithm" (docs/papers.md).
Plain Ray tasks (histograms over data-unit x feature partitions) and actors (histogram
sums and best splits over node partitions); no Ray Train. Kept light: heavy imports
happen in the entry files the core calls, run.py (mode=train) and predict.py (mode=predict).
"""
from __future__ import annotations

STRATEGIES = ("tasks",)


def validate(cfg: dict) -> None:
    """Check every `forest.*` knob before Ray starts; raises orchard.ConfigError."""
    from orchard.api import ConfigError, schema, require, require_path, Storage

    from .checkpoint import CHECKPOINT_NAME, previous_checkpoint
    from .schema import Forest

    forest_cfg = cfg["forest"]
    schema.check(Forest, forest_cfg, "forest")  # each key's type and range (workloads/forest/schema.py)
    for i, entry in enumerate(forest_cfg.get("partitions_by_depth") or []):
        if not isinstance(entry, dict) or "from_depth" not in entry \
                or not set(entry) <= {"from_depth", "data_units", "features", "nodes"} \
                or any(not isinstance(v, int) or v < (0 if k == "from_depth" else 1) for k, v in entry.items()):
            raise ConfigError(f"forest.partitions_by_depth[{i}]",
                              f"{{from_depth: int >= 0, data_units|features|nodes: int >= 1}}, got {entry!r}")
    if forest_cfg["partitions"]["features"] > forest_cfg["n_offsets"]:
        raise ConfigError("forest.partitions.features",
                          f"at most forest.n_offsets={forest_cfg['n_offsets']} feature partitions, "
                          f"got {forest_cfg['partitions']['features']}")
    one_node = forest_cfg["n_offsets"] * (forest_cfg["n_thresholds"] + 1) * 31 * 4
    if forest_cfg["memory_budget_mb"] * 2**20 < one_node:
        raise ConfigError("forest.memory_budget_mb",
                          f"at least {one_node / 2**20:.2f} (one node's full histogram), "
                          f"got {forest_cfg['memory_budget_mb']}")
    try:
        from .depth_png import palette_array
        palette_array(forest_cfg["palette"])
    except Exception as exc:  # noqa: BLE001 - any malformed palette is a config error
        raise ConfigError("forest.palette", f"32 distinct '#rrggbb' colours (31 parts, then background): {exc}")
    require_path(cfg, "forest.data_dir", kind="dir")
    if forest_cfg.get("data_dir"):
        _check_data_dir(forest_cfg)
    if forest_cfg.get("resume") is not None:
        require(cfg, "forest.resume", lambda v: previous_checkpoint(v, Storage.previous_run(cfg)) is not None,
                f"a {CHECKPOINT_NAME} file or a run folder that holds one")


def _check_data_dir(forest_cfg: dict) -> None:
    """A real-data folder must hold >= 2 pairs and at least one usable body pixel: otherwise
    the run would train on nothing (exit 2 before anything starts, not an accuracy of 0).
    Pairs are read in name order only up to the first usable one."""
    from orchard.api import ConfigError

    from .depth_png import first_usable_pair, pair_stems

    stems = pair_stems(forest_cfg["data_dir"])
    if len(stems) < 2:
        raise ConfigError("forest.data_dir", f"a folder with >= 2 <stem>_depth.png / <stem>_labels.png "
                          f"pairs; {forest_cfg['data_dir']!r} has {len(stems)}")
    from .depth_png import palette_array
    usable, problems = first_usable_pair(stems, palette_array(forest_cfg["palette"]))
    if usable is None:
        raise ConfigError("forest.data_dir", f"pairs with body pixels; none of the {len(stems)} pairs in "
                          f"{forest_cfg['data_dir']!r} has one (first: {problems[0]})")


def resume(cfg: dict, previous_run_dir: str) -> None:
    """``python -m orchard resume <run id>``: continue from that run's last completed round."""
    from orchard.api import ConfigError, Storage

    from .checkpoint import CHECKPOINT_NAME, previous_checkpoint

    cfg["forest"]["resume"] = str(previous_run_dir)
    # its storage first (the driver's folder may be gone), then the folder on this machine
    if previous_checkpoint(previous_run_dir, Storage.previous_run(cfg)) is None:
        raise ConfigError("forest.resume", f"a run folder holding {CHECKPOINT_NAME}; the run stopped before "
                          f"its first round ended ({previous_run_dir})")
    cfg["forest"]["stop_after_rounds"] = None  # the deliberate crash of a test run is not carried over


def resources(cfg: dict):
    """What a run holds in Ray (orchard/cluster/placement.py): plain tasks and actors, all started by the
    run itself, so all inside a sweep trial's placement group.  ``strategy.num_workers`` tasks in
    flight, each ``strategy.cpus_per_worker`` CPUs (rendering and data-unit tasks: 1 CPU); the
    histogram actors take no CPU inside a trial, and outside one ``forest.actor_cpus`` each out
    of the workers' budget (the rounds refuse actors that leave no CPU for a task: train.py)."""
    from orchard.api import Resources, bundles

    s = cfg["strategy"]
    if cfg["mode"] == "predict":  # an actor pool of 1 CPU each, as many as fit (orchard/models/__init__.py)
        return Resources(in_trial=bundles(1, 1.0))
    return Resources(in_trial=bundles(s["num_workers"], max(1.0, float(s.get("cpus_per_worker", 1)))))


def headline(cfg: dict, metrics: dict) -> list[str]:
    """The paper's two figures of merit on held-out depth images."""
    return [f"body-part labels: pixel accuracy {metrics['test/pixel_accuracy']:.3f}, "
            f"mean per-class accuracy {metrics['test/mean_class_accuracy']:.3f} "
            f"({cfg['forest']['num_trees']} trees, depth {metrics.get('train/max_depth_reached', 0):.0f})"]


# What the logged model's loader (predict.py) imports: pinned in its requirements (orchard/models/logged.py).
MODEL_IMPORTS = ("numba", "cv2")


def headline_metric(metrics: dict) -> tuple[str, float]:
    """The paper's figure of merit (``headline/mean_class_accuracy``) on held-out depth images."""
    return "mean_class_accuracy", metrics["test/mean_class_accuracy"]


def dataset(cfg: dict) -> dict:
    """What a train run learns from, for its MLflow dataset input (orchard/tracking/datasets.py)."""
    forest_cfg = cfg["forest"]
    if forest_cfg["data_dir"]:
        folder = str(forest_cfg["data_dir"])
        return {"name": f"depth pairs {folder.rstrip('/').rsplit('/', 1)[-1]}", "path": forest_cfg["data_dir"]}
    keys = ("train_images", "test_images", "image_height", "image_width", "preprocess")
    sizes = (f"{forest_cfg['train_images']}+{forest_cfg['test_images']} "
             f"{forest_cfg['image_width']}x{forest_cfg['image_height']}")
    return {"name": f"synthetic avatars {sizes}",
            "generator": "workloads.forest.avatar", "settings": {**{k: forest_cfg[k] for k in keys}, "seed": cfg["seed"]}}
