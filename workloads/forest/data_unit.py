"""Data units (2.1): a depth image, its labels, and the examples (pixels) sampled from it.

A *block* groups a few data units so one Ray object carries them: a dict of
    depths  (n, H, W) uint16 mm          labels (n, H, W) uint8 (kept for evaluation)
    ex_img, ex_y, ex_x (E,) int32        ex_cls (E,) uint8 body-part label of each example
    block_id int, image_ids (n,) int32
Features are never stored: kernels compute eq. 1 on the fly from `depths` (2.1).
The trainer touches a unit only through these arrays and the feature kernel, so any
data whose examples can be featurised from their unit fits the same rounds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .body_parts import BACKGROUND


def sample_examples(depth: np.ndarray, labels: np.ndarray, count: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pick up to `count` body pixels with a depth reading, uniformly without replacement.

    Returns (ys, xs) int32 arrays (2.3: 300,000 pixels sampled down to 2,000 examples).
    """
    ys, xs = np.nonzero((labels != BACKGROUND) & (depth > 0))
    if len(ys) > count:
        keep = np.sort(rng.choice(len(ys), count, replace=False))
        ys, xs = ys[keep], xs[keep]
    return ys.astype(np.int32), xs.astype(np.int32)


def _local_stem(stem) -> Path:
    """A pair's stem on this node: a path as it is, a storage URI copied into the node cache
    (orchard/storage/), so a task never opens a path only the driver wrote."""
    from orchard.api import inside_folder, Storage, is_uri

    if not is_uri(stem):  # a pair whose file links out of its folder is skipped (LeavesFolder), never read
        for suffix in ("_depth.png", "_labels.png"):
            if Path(f"{stem}{suffix}").exists():
                inside_folder(f"{stem}{suffix}", Path(stem).parent)
        return Path(stem)
    folder, _, name = str(stem).rpartition("/")
    store = Storage(folder)
    for suffix in ("_depth.png", "_labels.png"):
        local = store.local_copy(name + suffix)
    return local.with_name(name)


def build_block(stems: list[str], image_ids: list[int], block_id: int, seed: int,
                palette: np.ndarray, preprocess_settings: dict, examples_per_image: int,
                keep_labels: bool) -> dict:
    """Load PNG pairs, apply the paper's preprocessing and sample examples -> one block.

    A pair that cannot be read (corrupt, truncated, missing its label image, mismatched
    sizes, colours outside the palette) is skipped and named in block["skipped"]
    (``orchard.tracking.skipped.SkippedFile``: the stem, its kind, the reason); a block whose every
    pair was skipped has no "depths".

    With probability `compose_prob` a scene is composed with the next image of the
    block (cyclically), making a two-person scene. Randomness is a pure function of
    (seed, image id), so a block is reproducible wherever and whenever it is built.
    """
    from orchard.api import SkippedFile, kind_of, one_line

    from .depth_png import preprocess, read_pair

    raw, skipped, kept_ids = [], [], []
    for stem, image_id in zip(stems, image_ids):
        try:
            raw.append(read_pair(_local_stem(stem), palette))
            kept_ids.append(image_id)
        except (OSError, ValueError) as exc:  # corrupt, truncated, mismatched: skip, counted by kind
            skipped.append(SkippedFile(str(stem), kind_of(exc), one_line(exc)))
    image_ids = kept_ids
    if not raw:
        return {"block_id": block_id, "image_ids": np.zeros(0, np.int32), "skipped": skipped}
    depths, label_images, ex = [], [], {"img": [], "y": [], "x": [], "cls": []}
    for k, (depth, labels) in enumerate(raw):
        rng = np.random.default_rng([seed, 7, image_ids[k]])
        partner = None
        if len(raw) > 1 and rng.random() < preprocess_settings["compose_prob"]:
            partner = raw[(k + 1) % len(raw)]
        depth, labels = preprocess(depth, labels, rng, preprocess_settings, partner)
        ys, xs = sample_examples(depth, labels, examples_per_image, rng)
        ex["img"].append(np.full(len(ys), k, np.int32))
        ex["y"].append(ys)
        ex["x"].append(xs)
        ex["cls"].append(labels[ys, xs].astype(np.uint8))
        depths.append(depth)
        label_images.append(labels)
    block = {"block_id": block_id, "image_ids": np.asarray(image_ids, np.int32),
             "depths": np.stack(depths), "skipped": skipped}
    block.update({f"ex_{k}": np.concatenate(v) for k, v in ex.items()})
    if keep_labels:
        block["labels"] = np.stack(label_images)
    return block


def tree_selection(block: dict, seed: int, tree_index: int, image_fraction: float,
                   pixel_fraction: float) -> np.ndarray:
    """Boolean mask (E,) of the block's examples that tree `tree_index` trains on.

    Appendix A: each tree is trained on a random subset of images and pixels. The mask
    depends only on (seed, tree, block id), so any task, retried or not, on any
    partitioning, selects the same examples.
    """
    rng = np.random.default_rng([seed, 11, tree_index, int(block["block_id"])])
    image_keep = rng.random(len(block["image_ids"])) < image_fraction
    pixel_keep = rng.random(len(block["ex_img"])) < pixel_fraction
    return image_keep[block["ex_img"]] & pixel_keep


def _block_and_report(*args):
    """Ray task body: (the block, or None if every pair was bad; a small report the driver reads)."""
    block = build_block(*args)
    report = {"skipped": block.pop("skipped"), "images": len(block["image_ids"]),
              "examples": len(block.get("ex_img", ()))}
    return (block if report["images"] else None), report


def build_blocks(stems: list[Path], images_per_block: int, seed: int, palette: np.ndarray,
                 preprocess_settings: dict, examples_per_image: int, keep_labels: bool,
                 first_block_id: int = 0, first_image_id: int = 0) -> tuple[list, list]:
    """Preprocess all PNG pairs in parallel Ray tasks; returns (ObjectRefs of the blocks,
    ObjectRefs of their reports {"skipped": [SkippedFile], "images", "examples"}).

    The blocks stay in Ray's object store (spilled to disk if needed): the "large
    collection of data units, distributed evenly" that every round reads.
    """
    import ray

    task = ray.remote(num_cpus=1, num_returns=2)(_block_and_report)
    refs, reports = [], []
    for b, start in enumerate(range(0, len(stems), images_per_block)):
        chunk = stems[start:start + images_per_block]
        ids = list(range(first_image_id + start, first_image_id + start + len(chunk)))
        block, report = task.remote([str(s) for s in chunk], ids, first_block_id + b, seed, palette,
                                    preprocess_settings, examples_per_image, keep_labels)
        refs.append(block)
        reports.append(report)
    return refs, reports
