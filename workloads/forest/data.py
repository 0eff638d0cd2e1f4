"""forest's data: the corpus of depth/label PNG pairs (the user's, or the synthetic avatars
rendered into the run storage), then the data units held in Ray's object store.

  corpus       real PNG pairs from `forest.data_dir` split by name order, or the synthetic avatar
               corpus rendered in parallel Ray tasks (avatar.py), in the same format (2.1,
               depth_png.py)
  load_blocks  preprocessing into data units (flip / compose / clutter / noise, 2,000 examples
               per image) in parallel Ray tasks (data_unit.py); the blocks stay in the object
               store; bad pairs skipped and counted (orchard/tracking/skipped.py)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .depth_png import pair_stems


def corpus(cfg: dict, storage, run_dir: Path, palette: np.ndarray, parallelism: int):
    """(train stems, test stems) of PNG pairs: real data split by name order, or rendered into
    the run's ``storage`` (``ctx.storage``)."""
    from .avatar import render_dataset

    forest_cfg = cfg["forest"]
    if forest_cfg.get("data_dir"):
        stems = pair_stems(forest_cfg["data_dir"])  # validate() saw >= 2 pairs, one of them usable
        n_test = min(len(stems) - 1, forest_cfg["test_images"])
        return stems[:len(stems) - n_test][:forest_cfg["train_images"]], stems[len(stems) - n_test:]
    h, w = forest_cfg["image_height"], forest_cfg["image_width"]
    data = storage.child("data")  # rendered into the run storage (s3://... on a cluster)
    if not data.is_local:
        return (render_dataset(data.child("train"), forest_cfg["train_images"], cfg["seed"], 0, h, w, palette,
                               parallelism),
                render_dataset(data.child("test"), forest_cfg["test_images"], cfg["seed"], 1, h, w, palette,
                               parallelism))
    train = render_dataset(run_dir / "data" / "train", forest_cfg["train_images"], cfg["seed"], 0, h, w,
                           palette, parallelism)
    test = render_dataset(run_dir / "data" / "test", forest_cfg["test_images"], cfg["seed"], 1, h, w,
                          palette, parallelism)
    return train, test


def checked_blocks(refs: list, report_refs: list, ctx, split: str) -> tuple[list, dict]:
    """Keep the blocks that hold images (before phase 1). Returns (block refs, {"skipped":
    [SkippedFile] named ``<split>/<stem>``, "images": n, "examples": n}); the caller reports
    the skipped pairs (orchard/tracking/skipped.py)."""
    import ray

    from orchard.api import SkippedFile

    reports = ray.get(report_refs)
    kept = [ref for ref, report in zip(refs, reports) if report["images"]]
    skipped = [SkippedFile(f"{split}/{Path(s.file).name}", s.kind, s.reason) for r in reports for s in r["skipped"]]
    return kept, {"skipped": skipped, **{k: sum(r[k] for r in reports) for k in ("images", "examples")}}


def load_blocks(cfg: dict, ctx, run_dir: Path, palette: np.ndarray, parallelism: int) -> tuple[list, list, float]:
    """The corpus as data-unit blocks materialised in the object store: (train block refs, test
    block refs, pairs skipped). Logs the data metrics at step 0; a ConfigError (exit 2) when
    no usable body pixel is left to train or test on."""
    import ray

    from orchard.api import skipped

    from .data_unit import build_blocks

    forest_cfg, seed = cfg["forest"], cfg["seed"]
    # the corpus in the real PNG format
    train_stems, test_stems = corpus(cfg, ctx.storage, run_dir, palette, parallelism)
    # data units: preprocessing + example sampling, materialised in the object store
    common = dict(seed=seed, palette=palette, preprocess_settings=forest_cfg["preprocess"],
                  examples_per_image=forest_cfg["examples_per_image"])
    train_refs, train_reports = build_blocks(train_stems, forest_cfg["images_per_block"], keep_labels=False, **common)
    test_refs, test_reports = build_blocks(test_stems, forest_cfg["images_per_block"], keep_labels=True,
                                           first_block_id=1_000_000, first_image_id=1_000_000, **common)
    # bad pairs are skipped and counted here, before phase 1: one line each, data/skipped_files,
    # data/skipped_files/<kind>, skipped.csv (orchard/tracking/skipped.py, as flower and video do)
    train_refs, train_data = checked_blocks(train_refs, train_reports, ctx, "training")
    test_refs, test_data = checked_blocks(test_refs, test_reports, ctx, "test")
    skipped.report(ctx, train_data["skipped"] + test_data["skipped"], "forest", step=0)
    train_data["skipped"], test_data["skipped"] = len(train_data["skipped"]), len(test_data["skipped"])
    ctx.log_metrics({"data/skipped_pairs": float(train_data["skipped"] + test_data["skipped"]),
                     "data/skipped_train_pairs": train_data["skipped"],
                     "data/train_images": train_data["images"], "data/train_examples": train_data["examples"],
                     "data/test_images": test_data["images"]}, step=0)
    if not train_data["examples"] or not test_refs:  # the contract: bad data found on reading -> exit 2
        from orchard.api import ConfigError
        raise ConfigError("forest.data_dir", f"usable body pixels; {train_data['images']} training and "
                          f"{test_data['images']} test images could be read, with {train_data['examples']} "
                          f"body-pixel examples")
    ray.wait(train_refs + test_refs, num_returns=len(train_refs) + len(test_refs), fetch_local=False)
    return train_refs, test_refs, float(train_data["skipped"] + test_data["skipped"])
