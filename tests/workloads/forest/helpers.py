"""Small in-process corpora for the forest tests (real PNG pairs written to tmp folders)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.forest.avatar import render_avatar_image
from workloads.forest.data_unit import build_block
from workloads.forest.depth_png import palette_array, write_pair

BG = np.float32(10000)  # the background depth (mm) a probe off the body reads (forest.background_mm's default)


def rendered(run_dir, split: str) -> list[Path]:
    """The depth PNGs of a run's synthetic corpus, ``split`` (train or test): rendered once per
    setting into the storage root beside the run folders (``<output_dir>/forest_data/avatars-<key>/``,
    workloads/forest/data.py), shared by the runs there."""
    return sorted(Path(run_dir).parents[1].glob(f"forest_data/avatars-*/{split}/*_depth.png"))


def palette(compose) -> np.ndarray:
    return palette_array(compose("workload=forest")["forest"]["palette"])


def write_corpus(folder: Path, count: int, pal: np.ndarray, height=60, width=80, seed=0) -> list[Path]:
    """Render `count` avatars and write them as real PNG pairs; returns the stems."""
    folder.mkdir(parents=True, exist_ok=True)
    stems = []
    for i in range(count):
        depth, labels = render_avatar_image([seed, 0, i], height, width)
        write_pair(folder / f"{i:04d}", depth, labels, pal)
        stems.append(folder / f"{i:04d}")
    return stems


def make_blocks(folder: Path, pal, n_images=8, per_block=2, examples=150, height=60, width=80,
                settings=None):
    """Blocks (dicts) built by the workload's own loader + preprocessing."""
    settings = settings or {"flip_prob": 0.5, "compose_prob": 0.0, "clutter_prob": 0.5,
                            "clutter_objects": 2, "noise_sigma_mm": 3.0, "dropout": 0.0}
    stems = write_corpus(folder, n_images, pal, height, width)
    return [build_block([str(s) for s in stems[i:i + per_block]], list(range(i, i + per_block)),
                        b, 0, pal, settings, examples, keep_labels=True)
            for b, i in enumerate(range(0, n_images, per_block))]


def tiny_forest_cfg(compose, **overrides) -> dict:
    """The smoke forest config shrunk further for in-process round tests."""
    f = compose("workload=forest", "debug=smoke")["forest"]
    f.update({"n_offsets": 16, "n_thresholds": 6, "num_trees": 1, "max_depth": 4,
              "min_examples": 10, "min_child_examples": 2, "image_width": 80, "image_height": 60,
              "partitions": {"data_units": 1, "features": 1, "nodes": 1}, "partitions_by_depth": []})
    f.update(overrides)
    return f
