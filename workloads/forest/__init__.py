"""workload=forest: the Kinect body-part decision forest trained in distributed rounds.

Source: Budiu, Shotton, Murray, Finocchio, "Parallelizing the Training of the Kinect
Body Parts Labeling Algorithm" (../shared/seeds/000_c5cb42071963b0ee.txt).
Plain Ray tasks (histograms over data-unit x feature partitions) and actors (histogram
sums and best splits over node partitions); no Ray Train. Kept light: heavy imports
happen in `run`.
"""
from __future__ import annotations

from pathlib import Path

STRATEGIES = ("tasks",)
CHECKPOINT_NAME = "forest_checkpoint.npz"


def resolve_checkpoint(path) -> Path:
    """A checkpoint file, or a run folder holding CHECKPOINT_NAME -> the checkpoint file; a
    storage URI (``s3://.../forest_checkpoint.npz``, orchard/storage.py) is returned as it is."""
    if "://" in str(path):
        return str(path)
    path = Path(path).expanduser()
    return path / CHECKPOINT_NAME if path.is_dir() else path


def _checkpoint_exists(path) -> bool:
    from orchard.storage import file_exists

    return file_exists(path)


def validate(cfg: dict) -> None:
    """Check every `forest.*` knob before Ray starts; raises orchard.ConfigError."""
    from orchard import ConfigError
    from orchard.config import require, require_path, require_positive

    f = cfg["forest"]
    for key in ("train_images", "test_images", "image_height", "image_width", "images_per_block",
                "examples_per_image", "num_trees", "max_depth", "n_offsets", "n_thresholds",
                "min_examples", "min_child_examples", "figure_images"):
        require_positive(cfg, f"forest.{key}", integer=True)
    for key in ("max_offset_m", "threshold_range_mm", "background_mm", "memory_budget_mb"):
        require_positive(cfg, f"forest.{key}")
    for key in ("image_fraction", "pixel_fraction"):
        require(cfg, f"forest.{key}", lambda v: 0 < v <= 1, "a fraction in (0, 1]")
    # the phase-2 kernel finds a response's bin by a six-step search over 64 (histogram_kernels.py)
    require(cfg, "forest.n_thresholds", lambda v: v <= 63, "an integer from 1 to 63 (2.3 uses 50)")
    require(cfg, "forest.unary_fraction", lambda v: 0 <= v <= 1, "a fraction in [0, 1]")
    require(cfg, "forest.min_gain", lambda v: v >= 0, "a number >= 0")
    require(cfg, "forest.small_round_example_features", lambda v: isinstance(v, (int, float)) and v >= 0,
            "a number >= 0")
    require(cfg, "forest.actor_cpus", lambda v: isinstance(v, (int, float)) and 0 <= v <= 64, "CPUs in [0, 64]")
    for key in ("flip_prob", "compose_prob", "clutter_prob", "dropout"):
        require(cfg, f"forest.preprocess.{key}", lambda v: 0 <= v <= 1, "a probability in [0, 1]")
    require(cfg, "forest.preprocess.noise_sigma_mm", lambda v: v >= 0, "a number >= 0")
    require(cfg, "forest.preprocess.clutter_objects", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
    require(cfg, "forest.image_height", lambda v: v >= 16, "at least 16 pixels")
    require(cfg, "forest.image_width", lambda v: v >= 16, "at least 16 pixels")
    for degree in ("data_units", "features", "nodes"):
        require_positive(cfg, f"forest.partitions.{degree}", integer=True)
    for i, entry in enumerate(f.get("partitions_by_depth") or []):
        if not isinstance(entry, dict) or "from_depth" not in entry \
                or not set(entry) <= {"from_depth", "data_units", "features", "nodes"} \
                or any(not isinstance(v, int) or v < (0 if k == "from_depth" else 1) for k, v in entry.items()):
            raise ConfigError(f"forest.partitions_by_depth[{i}]",
                              f"{{from_depth: int >= 0, data_units|features|nodes: int >= 1}}, got {entry!r}")
    if f["partitions"]["features"] > f["n_offsets"]:
        raise ConfigError("forest.partitions.features",
                          f"at most forest.n_offsets={f['n_offsets']} feature partitions, got {f['partitions']['features']}")
    one_node = f["n_offsets"] * (f["n_thresholds"] + 1) * 31 * 4
    if f["memory_budget_mb"] * 2**20 < one_node:
        raise ConfigError("forest.memory_budget_mb",
                          f"at least {one_node / 2**20:.2f} (one node's full histogram), got {f['memory_budget_mb']}")
    try:
        from .depth_png import palette_array
        palette_array(f["palette"])
    except Exception as exc:  # noqa: BLE001 - any malformed palette is a config error
        raise ConfigError("forest.palette", f"32 distinct '#rrggbb' colours (31 parts, then background): {exc}")
    require_path(cfg, "forest.data_dir", kind="dir")
    if f.get("data_dir"):
        _check_data_dir(f)
    if f.get("resume") is not None:
        require(cfg, "forest.resume", lambda v: _checkpoint_exists(resolve_checkpoint(v)),
                f"a {CHECKPOINT_NAME} file or a run folder that holds one")
    if f.get("stop_after_rounds") is not None:
        require_positive(cfg, "forest.stop_after_rounds", integer=True)


def _check_data_dir(f: dict) -> None:
    """A real-data folder must hold >= 2 pairs and at least one usable body pixel: otherwise
    the run would train on nothing (exit 2 before anything starts, not an accuracy of 0).
    Pairs are read in name order only up to the first usable one."""
    from orchard import ConfigError

    from .depth_png import first_usable_pair, pair_stems

    stems = pair_stems(f["data_dir"])
    if len(stems) < 2:
        raise ConfigError("forest.data_dir", f"a folder with >= 2 <stem>_depth.png / <stem>_labels.png "
                          f"pairs; {f['data_dir']!r} has {len(stems)}")
    from .depth_png import palette_array
    usable, problems = first_usable_pair(stems, palette_array(f["palette"]))
    if usable is None:
        raise ConfigError("forest.data_dir", f"pairs with body pixels; none of the {len(stems)} pairs in "
                          f"{f['data_dir']!r} has one (first: {problems[0]})")


def resume(cfg: dict, previous_run_dir: str) -> None:
    """``python -m orchard resume <run id>``: continue from that run's last completed round."""
    from orchard import ConfigError

    from orchard.storage import Storage

    kept = Storage.for_run(cfg, previous_run_dir)  # the run storage: the driver's folder may be gone
    if resolve_checkpoint(previous_run_dir).is_file():
        cfg["forest"]["resume"] = str(previous_run_dir)
    elif kept.exists(CHECKPOINT_NAME):
        cfg["forest"]["resume"] = f"{kept.uri}/{CHECKPOINT_NAME}"
    else:
        raise ConfigError("forest.resume", f"a run folder holding {CHECKPOINT_NAME}; the run stopped before "
                          f"its first round ended ({previous_run_dir})")
    cfg["forest"]["stop_after_rounds"] = None  # the deliberate crash of a test run is not carried over


def resources(cfg: dict):
    """What a run holds in Ray (orchard/placement.py): plain tasks and actors, all started by the
    run itself, so all inside a sweep trial's placement group.  ``strategy.num_workers`` tasks in
    flight, each ``strategy.cpus_per_worker`` CPUs (rendering and data-unit tasks: 1 CPU); the
    histogram actors take no CPU."""
    from orchard.placement import Resources, bundles

    s = cfg["strategy"]
    if cfg["mode"] == "predict":  # an actor pool of 1 CPU each, as many as fit (orchard/models.py)
        return Resources(in_trial=bundles(1, 1.0))
    return Resources(in_trial=bundles(s["num_workers"], max(1.0, float(s.get("cpus_per_worker", 1)))))


def headline(cfg: dict, metrics: dict) -> list[str]:
    """The paper's two figures of merit on held-out depth images."""
    return [f"body-part labels: pixel accuracy {metrics['test/pixel_accuracy']:.3f}, "
            f"mean per-class accuracy {metrics['test/mean_class_accuracy']:.3f} "
            f"({cfg['forest']['num_trees']} trees, depth {metrics.get('train/max_depth_reached', 0):.0f})"]


def run(cfg: dict, ctx) -> dict[str, float]:
    """Render/load data, train the forest in rounds, evaluate (see train.py); or, with
    mode=predict, label new depth images with a trained forest (predict.py)."""
    if cfg["mode"] == "predict":
        from .predict import run_predict

        return run_predict(cfg, ctx)
    from .train import train_and_evaluate

    return train_and_evaluate(cfg, ctx)
