"""The forest workload's driver: data, T trees in rounds, evaluation, figures.

  [1] corpus: real PNG pairs from `forest.data_dir`, or the synthetic avatar corpus
      rendered in parallel Ray tasks into the run folder, in the same format (2.1)
  [2] preprocessing into data units (flip / compose / clutter / noise, 2,000 examples
      per image) in parallel Ray tasks; the blocks stay in the object store
  [3] T trees, each grown in breadth-first rounds (rounds.py), checkpointed every round;
      `forest.resume` continues from the last completed round
  [4] evaluation on held-out images: per-pixel and mean per-class accuracy, confusion
      matrix, predicted labelings and per-round phase times as figures (figures.py),
      inference pixels/s
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import ray

from orchard import background, skipped

from . import CHECKPOINT_NAME, resolve_checkpoint
from .avatar import focal_length_px, render_dataset
from .body_parts import BACKGROUND, PART_NAMES
from .data_unit import build_blocks
from .depth_png import pair_stems, palette_array
from .features import candidate_pool
from . import figures
from .inference import accuracy_metrics, confusion_matrix, pack_forest, predict_images
from .rounds import RoundRunner
from .tree import config_fingerprint, load_checkpoint


def tree_pool(seed: int, tree_index: int, forest_cfg: dict):
    """Tree `tree_index`'s candidate features: offsets (F, 4) pixel-metres, thresholds (F, T) mm."""
    rng = np.random.default_rng([seed, 3, tree_index])
    max_offset_pxm = forest_cfg["max_offset_m"] * focal_length_px(forest_cfg["image_width"])
    return candidate_pool(rng, forest_cfg["n_offsets"], forest_cfg["n_thresholds"], max_offset_pxm,
                          forest_cfg["threshold_range_mm"], forest_cfg["unary_fraction"])


def corpus(cfg: dict, run_dir: Path, palette: np.ndarray, parallelism: int):
    """(train stems, test stems) of PNG pairs: real data split by name order, or rendered."""
    f = cfg["forest"]
    if f.get("data_dir"):
        stems = pair_stems(f["data_dir"])  # validate() saw >= 2 pairs, one of them usable
        n_test = min(len(stems) - 1, f["test_images"])
        return stems[:len(stems) - n_test][:f["train_images"]], stems[len(stems) - n_test:]
    h, w = f["image_height"], f["image_width"]
    from orchard.storage import Storage

    data = Storage.for_run(cfg, run_dir).child("data")  # rendered into the run storage (s3://... on a cluster)
    if not data.is_local:
        return (render_dataset(data.child("train"), f["train_images"], cfg["seed"], 0, h, w, palette, parallelism),
                render_dataset(data.child("test"), f["test_images"], cfg["seed"], 1, h, w, palette, parallelism))
    train = render_dataset(run_dir / "data" / "train", f["train_images"], cfg["seed"], 0, h, w,
                           palette, parallelism)
    test = render_dataset(run_dir / "data" / "test", f["test_images"], cfg["seed"], 1, h, w,
                          palette, parallelism)
    return train, test


def checked_blocks(refs: list, report_refs: list, ctx, split: str) -> tuple[list, dict]:
    """Keep the blocks that hold images (before phase 1). Returns (block refs, {"skipped":
    [SkippedFile] named ``<split>/<stem>``, "images": n, "examples": n}); the caller reports
    the skipped pairs (orchard/skipped.py)."""
    from orchard.skipped import SkippedFile

    reports = ray.get(report_refs)
    kept = [ref for ref, report in zip(refs, reports) if report["images"]]
    skipped = [SkippedFile(f"{split}/{Path(s.file).name}", s.kind, s.reason) for r in reports for s in r["skipped"]]
    return kept, {"skipped": skipped, **{k: sum(r[k] for r in reports) for k in ("images", "examples")}}


def initial_state(forest_cfg: dict, seed: int) -> dict:
    """A fresh checkpoint state, or the one `forest.resume` points at (same forest config)."""
    fingerprint = config_fingerprint(forest_cfg, seed)
    if forest_cfg.get("resume") is None:
        return {"fingerprint": fingerprint, "trees": [], "class_weights": [], "partial": None,
                "frontier": [], "next_depth": 0}
    state = load_checkpoint(resolve_checkpoint(forest_cfg["resume"]))
    if state["fingerprint"] != fingerprint:
        raise ValueError("forest.resume: the checkpoint was trained with a different forest "
                         f"config or seed:\n  checkpoint: {state['fingerprint']}\n  this run: {fingerprint}")
    return state


def evaluate(trees, class_weights, test_refs, forest_cfg, palette, ctx, step: int = 0,
             rounds: list[dict] | None = None) -> dict:
    """Metrics and figures of the finished forest on the held-out blocks; per-part accuracy
    as `test/class_acc/<part>` at `step` (the last round's); `rounds` (this run's round
    metrics) for the phase-times figure."""
    blocks = ray.get(test_refs)
    depths = np.concatenate([b["depths"] for b in blocks])
    truth = np.concatenate([b["labels"] for b in blocks])
    mask = (truth != BACKGROUND) & (depths > 0)
    predicted, pixels_per_s = predict_images(pack_forest(trees, class_weights), depths, mask,
                                             forest_cfg["background_mm"])
    confusion = confusion_matrix(np.where(mask, truth, BACKGROUND), predicted)
    acc = accuracy_metrics(confusion)
    figures.log_figures(ctx, depths=depths, truth=np.where(mask, truth, BACKGROUND), predicted=predicted,
                        palette=palette, confusion=confusion, class_accuracy=acc["class_accuracy"],
                        part_names=PART_NAMES, rounds=rounds or [], images=forest_cfg["figure_images"])
    ctx.log_dict({"parts": list(PART_NAMES), "confusion": confusion.tolist()}, "tables/confusion.json")
    per_class = {f"test/class_acc/{PART_NAMES[c]}": v for c, v in acc["class_accuracy"].items()}
    ctx.log_metrics(per_class, step=step)  # in MLflow; the summary shows the headline below
    worst = min(acc["class_accuracy"], key=acc["class_accuracy"].get) if per_class else None
    return {"test/pixel_accuracy": acc["pixel_accuracy"],
            "test/mean_class_accuracy": acc["mean_class_accuracy"],
            "test/worst_class_accuracy": acc["class_accuracy"][worst] if per_class else 0.0,
            "test/pixels": float(mask.sum()),
            "throughput/inference_pixels_per_s": pixels_per_s}


def train_and_evaluate(cfg: dict, ctx) -> dict[str, float]:
    """The workload's `run`: returns final metrics (`split/name`).

    A node lost meanwhile costs no result (docs/cluster.md, "Losing nodes"): Ray rebuilds its
    data blocks from their lineage and retries its tasks, its histogram actors come back on the
    nodes alive and the round redoes their share (rounds.py); the watch counts it."""
    from orchard.strategies.node_loss import NodeWatch

    round_ends: list[float] = []  # when each round finished: after a lost node, when training went on
    with NodeWatch(ctx) as watch:
        metrics = _train_and_evaluate(cfg, ctx, round_ends)
    # a loss cost the time until the round it interrupted finished (that round redid its share)
    return {**metrics, "cluster/nodes_lost": float(watch.nodes_lost), "cluster/nodes_joined": float(watch.joined),
            "train/lost_s": watch.lost_s(round_ends)}


def _train_and_evaluate(cfg: dict, ctx, round_ends: list) -> dict[str, float]:
    f, strategy, seed = cfg["forest"], cfg["strategy"], cfg["seed"]
    started = time.perf_counter()
    palette = palette_array(f["palette"])
    run_dir = Path(ctx.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    parallelism = max(1, int(strategy["num_workers"]))
    # [1] corpus in the real PNG format
    train_stems, test_stems = corpus(cfg, run_dir, palette, parallelism)
    # [2] data units: preprocessing + example sampling, materialised in the object store
    common = dict(seed=seed, palette=palette, preprocess_settings=f["preprocess"],
                  examples_per_image=f["examples_per_image"])
    train_refs, train_reports = build_blocks(train_stems, f["images_per_block"], keep_labels=False, **common)
    test_refs, test_reports = build_blocks(test_stems, f["images_per_block"], keep_labels=True,
                                           first_block_id=1_000_000, first_image_id=1_000_000, **common)
    # bad pairs are skipped and counted here, before phase 1: one line each, data/skipped_files,
    # data/skipped/<kind>, skipped.csv (orchard/skipped.py, as flower and video do)
    train_refs, train_data = checked_blocks(train_refs, train_reports, ctx, "training")
    test_refs, test_data = checked_blocks(test_refs, test_reports, ctx, "test")
    skipped.report(ctx, train_data["skipped"] + test_data["skipped"], "forest", step=0)
    train_data["skipped"], test_data["skipped"] = len(train_data["skipped"]), len(test_data["skipped"])
    ctx.log_metrics({"data/skipped_pairs": float(train_data["skipped"] + test_data["skipped"]),
                     "data/skipped_train_pairs": train_data["skipped"],
                     "data/train_images": train_data["images"], "data/train_examples": train_data["examples"],
                     "data/test_images": test_data["images"]}, step=0)
    if not train_data["examples"] or not test_refs:  # the contract: bad data found on reading -> exit 2
        from orchard import ConfigError
        raise ConfigError("forest.data_dir", f"usable body pixels; {train_data['images']} training and "
                          f"{test_data['images']} test images could be read, with {train_data['examples']} "
                          f"body-pixel examples")
    ray.wait(train_refs + test_refs, num_returns=len(train_refs) + len(test_refs), fetch_local=False)
    data_s = time.perf_counter() - started
    # [3] trees in rounds
    state = initial_state(f, seed)
    total_rounds = f["num_trees"] * f["max_depth"]
    history: list[dict] = []

    def on_round(tree_index, depth, metrics):
        step = tree_index * f["max_depth"] + depth
        history.append(metrics)
        round_ends.append(time.time())
        ctx.log_metrics(metrics, step=step)
        ctx.progress(step + 1, total_rounds, desc=f"tree {tree_index + 1}/{f['num_trees']} depth {depth}",
                     **{"Mef/s": metrics["round/example_features_per_s"] / 1e6})

    from orchard.storage import Storage, read_file

    run_storage = Storage.for_run(cfg, run_dir)
    # the checkpoint lives in the run storage: a resume needs nothing of this machine's disk
    checkpoint = run_dir / CHECKPOINT_NAME if run_storage.is_local else f"{run_storage.uri}/{CHECKPOINT_NAME}"
    runner = RoundRunner(train_refs, f, strategy, seed, checkpoint, on_round)
    train_start = time.perf_counter()
    def grow_all():
        for tree_index in range(len(state["trees"]), f["num_trees"]):
            runner.train_tree(tree_index, tree_pool(seed, tree_index, f), state)

    try:
        # off the main thread (orchard/background.py): the rounds submit thousands of tasks, and a
        # SIGTERM landing while the main thread submits one reaches orchard as a SIGINT; on an
        # interrupt `stopping` is set and the rounds cancel their tasks within a second or so
        background.call(grow_all, name="forest-rounds", stopping=runner.stopping)
    finally:
        runner.shutdown()
    train_s = time.perf_counter() - train_start
    if not run_storage.is_local:
        (run_dir / CHECKPOINT_NAME).write_bytes(read_file(checkpoint))
    ctx.log_artifact(run_dir / CHECKPOINT_NAME, "model")
    from .predict import log_model
    log_model(ctx, state["trees"], state["class_weights"], f, palette)  # the MLflow Model (docs/models.md)
    # [4] evaluation
    metrics = evaluate(state["trees"], state["class_weights"], test_refs, f, palette, ctx,
                       step=total_rounds - 1, rounds=history)
    phase2 = sum(m["round/phase2_s"] for m in history)
    metrics.update({
        "train/trees": float(len(state["trees"])),
        "train/nodes": float(sum(len(t["left"]) for t in state["trees"])),
        "train/max_depth_reached": float(max(int(t["depth"].max()) for t in state["trees"])),
        "train/rounds_this_run": float(len(history)),
        "train/hist_peak_bytes": float(max([m["round/hist_peak_bytes"] for m in history] or [0])),
        "train/shuffle_bytes": float(sum(m["round/shuffle_bytes"] for m in history)),
        "data/skipped_pairs": float(train_data["skipped"] + test_data["skipped"]),
        "throughput/example_features_per_s": (
            sum(m["round/example_features_per_s"] * m["round/phase2_s"] for m in history) / phase2
            if phase2 else 0.0),
        "throughput/effective_parallelism": (
            sum(m["round/effective_parallelism"] * m["round/total_s"] for m in history)
            / max(sum(m["round/total_s"] for m in history), 1e-9)),
        "train/restarts": float(runner.actor_replays),  # histogram actors' shares redone after a loss
        "time/data_s": data_s, "time/train_s": train_s,
        "time/total_s": time.perf_counter() - started,
    })
    return metrics
