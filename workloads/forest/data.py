"""forest's data: the corpus of depth/label PNG pairs (the user's, or the synthetic avatars
rendered into the storage root once per setting), then the data units held in Ray's object store.

  corpus       real PNG pairs from `forest.data_dir` split by name order, or the synthetic avatar
               corpus rendered in parallel Ray tasks (avatar.py), in the same format (2.1,
               depth_png.py), once per setting into the storage root and shared by runs
  load_blocks  preprocessing into data units (flip / compose / clutter / noise, 2,000 examples
               per image) in parallel Ray tasks (data_unit.py); the blocks stay in the object
               store; bad pairs skipped and counted (orchard/tracking/skipped.py)
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .depth_png import pair_stems


def corpus(cfg: dict, palette: np.ndarray, parallelism: int):
    """(train stems, test stems, whether they were there before this run) of PNG pairs: real data
    split by name order, or the synthetic avatars of ``synthetic_corpus``."""
    forest_cfg = cfg["forest"]
    if forest_cfg.get("data_dir"):
        stems = pair_stems(forest_cfg["data_dir"])  # validate() saw >= 2 pairs, one of them usable
        n_test = min(len(stems) - 1, forest_cfg["test_images"])
        return stems[:len(stems) - n_test][:forest_cfg["train_images"]], stems[len(stems) - n_test:], True
    return synthetic_corpus(cfg, palette, parallelism)


def synthetic_corpus(cfg: dict, palette: np.ndarray, parallelism: int) -> tuple[list, list, bool]:
    """The synthetic avatars of this config, rendered once into the storage root and read by
    every run with the same settings (``<root>/forest_data/avatars-<key>/{train,test}``, as
    flower keeps its field and video its videos): a sweep's trials, a resumed run and a second
    run read the first one's images instead of rendering them again.

    Image i of a split is a pure function of (seed, split, i) (avatar.py), so the key hashes
    what changes the pixels: the counts, the seed, the image size, the palette and the
    renderer's own source. Published whole: a local folder is rendered beside its place and
    renamed into it (``atomic_folder``: a concurrent run sees all of it or none, and the first
    one published stays), a remote one (``storage.uri=s3://...``) is marked complete last."""
    from orchard.api import atomic_folder, Storage

    from . import avatar, body_parts, depth_png

    f, seed = cfg["forest"], cfg["seed"]
    h, w, counts = f["image_height"], f["image_width"], {"train": f["train_images"], "test": f["test_images"]}
    renderer = hashlib.sha1(b"".join(Path(m.__file__).read_bytes() for m in (avatar, body_parts, depth_png)))
    settings = {**counts, "seed": seed, "size": [h, w], "palette": np.asarray(palette).tolist(),
                "renderer": renderer.hexdigest()}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    store = Storage.root(cfg).child("forest_data", f"avatars-{digest}")

    def render(folder) -> None:  # both splits into a local folder or a Storage folder
        for split_id, split in enumerate(("train", "test")):
            where = folder / split if isinstance(folder, Path) else folder.child(split)
            avatar.render_dataset(where, counts[split], seed, split_id, h, w, palette, parallelism)

    def stems(folder_of) -> tuple[list, list]:  # pair stems: paths here, URIs in a bucket
        return tuple([folder_of(split) / f"{i:06d}" if store.is_local else f"{folder_of(split)}/{i:06d}"
                      for i in range(counts[split])] for split in ("train", "test"))

    if store.is_local:
        root = store.local_path
        reused = root.is_dir()
        if not reused:  # another run that published it first keeps its copy (the same pixels)
            with atomic_folder(root, keep_existing=True) as partial:
                render(partial)
        return (*stems(lambda split: root / split), reused)
    reused = store.complete()
    if not reused:
        render(store)
        store.write_bytes("_COMPLETE", b"complete\n")  # what complete() looks for: written last
    return (*stems(lambda split: store.child(split).uri), reused)


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


def last_wave(report_refs: list) -> None:
    """Return once fewer of the data-unit tasks (their `report_refs`) are left running or
    queued than the cluster has CPUs: the data step's last wave, which leaves cores idle (33
    tasks on 16 CPUs run as 16, 16 and 1) for what the next step can start early."""
    import ray

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if len(report_refs) >= cpus:
        ray.wait(report_refs, num_returns=len(report_refs) - cpus + 1, fetch_local=False)


def load_blocks(cfg: dict, ctx, palette: np.ndarray, parallelism: int,
                on_last_wave=None) -> tuple[list, list, float]:
    """The corpus as data-unit blocks materialised in the object store: (train block refs, test
    block refs, pairs skipped). Logs the data metrics at step 0; a ConfigError (exit 2) when
    no usable body pixel is left to train or test on. ``on_last_wave()`` is called once fewer
    data-unit tasks are left than the cluster has CPUs (``last_wave``), before any is read."""
    import ray

    from orchard.api import skipped

    from .data_unit import build_blocks

    forest_cfg, seed = cfg["forest"], cfg["seed"]
    # the corpus in the real PNG format
    train_stems, test_stems, reused = corpus(cfg, palette, parallelism)
    # data units: preprocessing + example sampling, materialised in the object store
    common = dict(seed=seed, palette=palette, preprocess_settings=forest_cfg["preprocess"],
                  examples_per_image=forest_cfg["examples_per_image"])
    train_refs, train_reports = build_blocks(train_stems, forest_cfg["images_per_block"], keep_labels=False, **common)
    test_refs, test_reports = build_blocks(test_stems, forest_cfg["images_per_block"], keep_labels=True,
                                           first_block_id=1_000_000, first_image_id=1_000_000, **common)
    if on_last_wave is not None:
        last_wave(train_reports + test_reports)
        on_last_wave()
    # bad pairs are skipped and counted here, before phase 1: one line each, data/skipped_files,
    # data/skipped_files/<kind>, skipped.csv (orchard/tracking/skipped.py, as flower and video do)
    train_refs, train_data = checked_blocks(train_refs, train_reports, ctx, "training")
    test_refs, test_data = checked_blocks(test_refs, test_reports, ctx, "test")
    skipped.report(ctx, train_data["skipped"] + test_data["skipped"], "forest", step=0)
    train_data["skipped"], test_data["skipped"] = len(train_data["skipped"]), len(test_data["skipped"])
    if not forest_cfg.get("data_dir"):  # bookkeeping (orchard/tracking/bookkeeping.py), as flower's tiles_hits
        ctx.log_metrics({"cache/avatars_hits": float(reused)}, step=0)
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
