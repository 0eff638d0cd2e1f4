"""A decision tree grown breadth first, and the forest checkpoint (section 3).

Nodes are numbered in creation order (breadth first). Node n is internal iff
left[n] >= 0; it sends an example left when eq. 1 with offsets[n] is < threshold[n].
`counts[n]` holds the unweighted class counts of the training examples that reach n;
leaf distributions re-weight them by the tree's class weights (phase 1's normalisation
constants) so rare parts are not swamped by the torso.
The checkpoint is a .npz of plain arrays (never a pickle), written to a temporary
file and renamed, so a crash mid-write leaves the previous round's checkpoint intact.
"""
from __future__ import annotations

import json
import io
import os
from pathlib import Path

import numpy as np

_FIELDS = ("offsets", "threshold", "left", "right", "depth", "feature", "counts")


class Tree:
    """Growable arrays of one tree; `arrays()` gives the contiguous views kernels need."""

    def __init__(self, n_classes: int):
        self.n_classes = n_classes
        self.offsets: list = []
        self.threshold: list = []
        self.left: list = []
        self.right: list = []
        self.depth: list = []
        self.feature: list = []
        self.counts: list = []

    def __len__(self) -> int:
        return len(self.left)

    def add_node(self, depth: int, counts: np.ndarray) -> int:
        """Append an (unsplit) node with class counts (C,); returns its id."""
        self.offsets.append(np.zeros(4, np.float32))
        self.threshold.append(0.0)
        self.left.append(-1)
        self.right.append(-1)
        self.depth.append(depth)
        self.feature.append(-1)
        self.counts.append(np.asarray(counts, np.int64))
        return len(self.left) - 1

    def split(self, node: int, feature: int, offsets: np.ndarray, threshold: float,
              left_counts: np.ndarray, right_counts: np.ndarray) -> tuple[int, int]:
        """Turn `node` into an internal node; returns the ids of its (left, right) children."""
        self.offsets[node] = np.asarray(offsets, np.float32)
        self.threshold[node] = float(threshold)
        self.feature[node] = int(feature)
        left = self.add_node(self.depth[node] + 1, left_counts)
        right = self.add_node(self.depth[node] + 1, right_counts)
        self.left[node], self.right[node] = left, right
        return left, right

    def arrays(self) -> dict:
        """Contiguous numpy arrays of every field (what tasks and checkpoints carry)."""
        return {
            "offsets": np.array(self.offsets, np.float32).reshape(-1, 4),
            "threshold": np.array(self.threshold, np.float32),
            "left": np.array(self.left, np.int32),
            "right": np.array(self.right, np.int32),
            "depth": np.array(self.depth, np.int16),
            "feature": np.array(self.feature, np.int32),
            "counts": np.array(self.counts, np.int64).reshape(-1, self.n_classes),
        }

    @classmethod
    def from_arrays(cls, arrays: dict) -> "Tree":
        """Inverse of `arrays()`."""
        tree = cls(arrays["counts"].shape[1])
        tree.offsets = [row.copy() for row in arrays["offsets"]]
        tree.threshold = [float(v) for v in arrays["threshold"]]
        tree.left = [int(v) for v in arrays["left"]]
        tree.right = [int(v) for v in arrays["right"]]
        tree.depth = [int(v) for v in arrays["depth"]]
        tree.feature = [int(v) for v in arrays["feature"]]
        tree.counts = [row.copy() for row in arrays["counts"]]
        return tree


def leaf_distributions(arrays: dict, class_weights: np.ndarray) -> np.ndarray:
    """Per-node class distribution P(c | node), (N, C) float32, from weighted counts."""
    weighted = arrays["counts"] * class_weights[None, :]
    total = weighted.sum(axis=1, keepdims=True)
    return (weighted / np.where(total > 0, total, 1.0)).astype(np.float32)


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
    from orchard.storage import is_uri, write_file

    if is_uri(path):  # the run storage on a cluster (orchard/storage.py): one object, written whole
        buffer = io.BytesIO()
        np.savez(buffer, **flat)
        write_file(path, buffer.getvalue())
        return
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **flat)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    """Read a checkpoint written by `save_checkpoint` (no pickles allowed); a path or a URI."""
    from orchard.storage import is_uri, read_file

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
    partitioning and memory budget excluded, since they never change the result)."""
    ignored = {"resume", "partitions", "partitions_by_depth", "memory_budget_mb", "actor_cpus", "verify_counts",
               "small_round_example_features",
               "stop_after_rounds", "test_images", "figure_images"}
    kept = {k: v for k, v in forest_cfg.items() if k not in ignored}
    return json.dumps({"seed": seed, "forest": kept}, sort_keys=True, default=str)
