"""What a forest run saves and how it resumes from it (section 3).

The checkpoint (`CHECKPOINT_NAME`, in the run storage: the run folder, or ``s3://...`` on a
cluster) holds the finished trees, each started tree's class weights, and the partial tree of
the last completed round with its frontier. It is a .npz of plain arrays (never a pickle),
written whole (``storage.write_file``: a local one fsynced and renamed), so a crash or a full disk
mid-write leaves the previous round's checkpoint intact. `forest.resume` (or ``python -m orchard resume <run id>``) continues from
it when the forest config and seed match (`config_fingerprint`).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

CHECKPOINT_NAME = "forest_checkpoint.npz"
_FIELDS = ("offsets", "threshold", "left", "right", "depth", "feature", "counts")


def resolve_checkpoint(path) -> Path:
    """A checkpoint file, or a run folder holding CHECKPOINT_NAME -> the checkpoint file; a
    storage URI (``s3://.../forest_checkpoint.npz``, orchard/storage/) is returned as it is."""
    if "://" in str(path):
        return str(path)
    path = Path(path).expanduser()
    return path / CHECKPOINT_NAME if path.is_dir() else path


def checkpoint_exists(path) -> bool:
    """Is there a file at `path` (a local path or a storage URI)?"""
    from orchard.api import file_exists

    return file_exists(path)


def run_checkpoint(run_storage) -> str:
    """Where this run writes its checkpoint: in the run storage (``ctx.storage``), so a resume
    needs nothing of this machine's disk: orchard's own run folder, or for a folder the user
    named (``hydra.run.dir``) its keyed folder under the storage root, or a URI. Never the named
    folder itself: there a second run would overwrite the first's checkpoint, unseen by the
    check that refuses a new run in a folder whose storage holds one (run/preflight.py)."""
    return run_storage.child(CHECKPOINT_NAME).uri


def log_checkpoint(ctx, run_dir: Path, checkpoint) -> None:
    """The last checkpoint as the run's artifact ``model/forest_checkpoint.npz`` (copied into
    the run folder first when it lives elsewhere: remote storage, a named folder's keyed one)."""
    from orchard.api import is_uri, read_file

    local = run_dir / CHECKPOINT_NAME
    if is_uri(checkpoint) or Path(checkpoint).resolve() != local.resolve():
        local.write_bytes(read_file(checkpoint))
    ctx.log_artifact(local, "model")


def previous_checkpoint(resume, previous_storage):
    """The checkpoint `forest.resume` points at, or None where there is none: the previous run's
    storage first (``Storage.previous_run``: on a cluster a bucket, the driver's folder may be
    gone), then `resume` itself as a path of this machine (a checkpoint file, or a run folder
    whose storage is elsewhere)."""
    if previous_storage is not None and previous_storage.exists(CHECKPOINT_NAME):
        return previous_storage.child(CHECKPOINT_NAME).uri
    local = resolve_checkpoint(resume)
    return local if checkpoint_exists(local) else None


def initial_state(forest_cfg: dict, seed: int, previous_storage=None) -> dict:
    """A fresh checkpoint state, or the one `forest.resume` points at (same forest config);
    ``previous_storage``: the storage of the run it names (``ctx.previous_storage``)."""
    fingerprint = config_fingerprint(forest_cfg, seed)
    if forest_cfg.get("resume") is None:
        return {"fingerprint": fingerprint, "trees": [], "class_weights": [], "partial": None,
                "frontier": [], "next_depth": 0}
    checkpoint = previous_checkpoint(forest_cfg["resume"], previous_storage)
    if checkpoint is None:
        raise ValueError(f"forest.resume: no {CHECKPOINT_NAME} at {forest_cfg['resume']} or in its run storage")
    state = load_checkpoint(checkpoint)
    if state["fingerprint"] != fingerprint:
        raise ValueError("forest.resume: the checkpoint was trained with a different forest "
                         f"config or seed:\n  checkpoint: {state['fingerprint']}\n  this run: {fingerprint}")
    return state


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomically write the forest state.

    state: {"fingerprint": str, "trees": [arrays...] (finished), "class_weights":
    [(C,)...] (one per started tree), "partial": arrays or None, "frontier": (K,) int,
    "next_depth": int}.
    """
    flat = {"fingerprint": np.array(state["fingerprint"]),
            "n_trees": np.array(len(state["trees"])),
            "next_depth": np.array(state["next_depth"]),
            "frontier": np.asarray(state["frontier"], np.int64),
            "has_partial": np.array(state["partial"] is not None)}
    for t, arrays in enumerate(state["trees"]):
        flat.update({f"tree{t}_{k}": v for k, v in arrays.items()})
    for t, weights in enumerate(state["class_weights"]):
        flat[f"weights{t}"] = weights
    if state["partial"] is not None:
        flat.update({f"partial_{k}": v for k, v in state["partial"].items()})
    from orchard.api import write_file

    buffer = io.BytesIO()
    np.savez(buffer, **flat)
    # whole or not at all (orchard/storage/atomic.py): a local file through write_atomic (fsynced, renamed;
    # a full disk is StorageFull naming the file, the previous round's kept), a URI as one object
    write_file(path, buffer.getvalue())


def load_checkpoint(path: Path) -> dict:
    """Read a checkpoint written by `save_checkpoint` (no pickles allowed); a path or a URI."""
    from orchard.api import is_uri, read_file

    source = io.BytesIO(read_file(path)) if is_uri(path) else Path(path)
    with np.load(source, allow_pickle=False) as data:
        n_trees = int(data["n_trees"])
        state = {
            "fingerprint": str(data["fingerprint"]),
            "trees": [{k: data[f"tree{t}_{k}"] for k in _FIELDS} for t in range(n_trees)],
            "class_weights": [data[k] for k in sorted(
                (k for k in data.files if k.startswith("weights")), key=lambda k: int(k[7:]))],
            "partial": ({k: data[f"partial_{k}"] for k in _FIELDS}
                        if bool(data["has_partial"]) else None),
            "frontier": data["frontier"].tolist(),
            "next_depth": int(data["next_depth"]),
        }
    return state


def config_fingerprint(forest_cfg: dict, seed: int) -> str:
    """What must match for a resume to continue the same forest (resume path excluded;
    partitioning, memory budget, histogram subtraction and the bin cache excluded: they never
    change the result)."""
    ignored = {"resume", "partitions", "partitions_by_depth", "memory_budget_mb", "actor_cpus", "actors_per_worker",
               "verify_counts", "small_round_example_features", "histogram_subtraction", "bin_cache_mb",
               "stop_after_rounds", "test_images", "figure_images"}
    kept = {k: v for k, v in forest_cfg.items() if k not in ignored}
    return json.dumps({"seed": seed, "forest": kept}, sort_keys=True, default=str)
