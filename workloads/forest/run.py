"""The forest workload's entry (mode=train): data, T trees in rounds, evaluation, model and figures.

  1. data      the corpus of PNG pairs (the user's `forest.data_dir`, or synthetic avatars
               rendered in parallel Ray tasks), preprocessed into data units (2,000 examples
               per image) in parallel Ray tasks; the blocks stay in the object store (data.py);
               the rounds' histogram actors start on the cores its last wave leaves idle
  2. train     T trees, each grown in breadth-first rounds on Ray tasks and histogram actors
               (train.py), checkpointed every round; `forest.resume` continues from the last
               completed round (checkpoint.py)
  3. evaluate  held-out images: per-pixel and mean per-class accuracy, confusion matrix,
               inference pixels/s (evaluate.py)
  4. log       the MLflow Model (predict.py), predicted labelings, per-part accuracy, confusion
               and per-round phase times as figures (figures.py)
"""
from __future__ import annotations

import time
from pathlib import Path

from .body_parts import PART_NAMES
from .checkpoint import initial_state, log_checkpoint, run_checkpoint
from .data import load_blocks
from .depth_png import palette_array
from .evaluate import evaluate
from .figures import log_figures
from .predict import log_model
from .train import grow_forest, round_runner


def run(cfg: dict, ctx) -> dict[str, float]:
    """The workload's entry: returns final metrics (`split/name`).

    A node lost meanwhile costs no result (docs/cluster.md, "Losing nodes"): Ray rebuilds its
    data blocks from their lineage and retries its tasks, its histogram actors come back on the
    nodes alive and the round redoes their share (train.py); the watch counts it."""
    from orchard.api import NodeWatch

    round_ends: list[float] = []  # when each round finished: after a lost node, when training went on
    with NodeWatch(ctx) as watch:
        metrics = _run(cfg, ctx, round_ends)
    # a loss cost the time until the round it interrupted finished (that round redid its share)
    return {**metrics, "cluster/nodes_lost": float(watch.nodes_lost), "cluster/nodes_joined": float(watch.joined),
            "train/lost_s": watch.lost_s(round_ends)}


def _run(cfg: dict, ctx, round_ends: list) -> dict[str, float]:
    f, strategy, seed = cfg["forest"], cfg["strategy"], cfg["seed"]
    started = time.perf_counter()
    palette = palette_array(f["palette"])
    run_dir = Path(ctx.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    parallelism = max(1, int(strategy["num_workers"]))

    # the state to grow from (fresh, or the checkpoint `forest.resume` names: refused before the data)
    state = initial_state(f, seed, ctx.previous_storage)
    first_depth = state["next_depth"] if state["partial"] is not None else 0
    # a resumed run goes on at the round after its checkpoint's (the others log resumed_from_epoch)
    first_round = len(state["trees"]) * f["max_depth"] + first_depth
    checkpoint = run_checkpoint(ctx.storage)
    with round_runner(cfg, ctx, checkpoint, round_ends) as (runner, history):
        # 1. data: the corpus in the real PNG format, then data units in the object store; the
        # histogram actors start on the cores its last wave leaves idle
        train_refs, test_refs, skipped_pairs = load_blocks(
            cfg, ctx, palette, parallelism, on_last_wave=lambda: runner.start_actors_early(first_depth))
        data_s = time.perf_counter() - started
        ctx.mark("data")

        # 2. train: the trees in rounds, checkpointed every round into the run storage
        train_start, driver_cpu_start = time.perf_counter(), time.process_time()
        grow_forest(runner, train_refs, state)
        train_s, driver_cpu_s = time.perf_counter() - train_start, time.process_time() - driver_cpu_start
        restarts, started_early = runner.actor_replays, runner.actors_started_early
    ctx.mark("training")
    log_checkpoint(ctx, run_dir, checkpoint)
    ctx.mark("checkpoints")

    # 3. evaluate on the held-out images
    total_rounds = f["num_trees"] * f["max_depth"]
    metrics, labelled = evaluate(state["trees"], state["class_weights"], test_refs, f, ctx, step=total_rounds - 1)
    ctx.mark("evaluation")

    # 4. the figures, drawn in a Ray task beside the model's logging (docs/models.md)
    figures = ctx.draw(log_figures, **labelled, palette=palette, part_names=PART_NAMES, rounds=history,
                       images=f["figure_images"])
    log_model(ctx, state["trees"], state["class_weights"], f, palette)
    ctx.mark("model")
    figures.result()
    ctx.mark("figures")

    phase2 = sum(m["round/phase2_s"] for m in history)
    metrics.update({
        "train/trees": float(len(state["trees"])),
        "train/nodes": float(sum(len(t["left"]) for t in state["trees"])),
        "train/max_depth_reached": float(max(int(t["depth"].max()) for t in state["trees"])),
        "train/rounds_this_run": float(len(history)),
        "train/hist_peak_bytes": float(max([m["round/hist_peak_bytes"] for m in history] or [0])),
        "train/shuffle_bytes": float(sum(m["round/shuffle_bytes"] for m in history)),
        "train/parent_wire_bytes": float(sum(m.get("round/parent_wire_bytes", 0) for m in history)),
        "train/parents_lost": float(sum(m.get("round/parents_lost", 0) for m in history)),
        # histogram subtraction: the share of the run's example-feature evaluations derived, not counted
        "train/subtraction_saved": 1.0 - sum(m["round/examples_histogrammed"] for m in history)
        / max(sum(m["round/examples"] for m in history), 1),
        "data/skipped_pairs": skipped_pairs,
        "throughput/example_features_per_s": (
            sum(m["round/example_features_per_s"] * m["round/phase2_s"] for m in history) / phase2
            if phase2 else 0.0),
        "throughput/effective_parallelism": (
            sum(m["round/effective_parallelism"] * m["round/total_s"] for m in history)
            / max(sum(m["round/total_s"] for m in history), 1e-9)),
        **phase_seconds(history),
        # the busy seconds behind the effective parallelism, by who was busy, and the tasks run
        **{f"train/{k}": float(sum(m[f"round/{k}"] for m in history))
           for k in ("task_busy_s", "actor_busy_s", "phase2_tasks", "phase2_sparse_tasks")},
        # the worker processes those tasks ran in: the workers, unless Ray replaced idle ones
        "train/task_processes": float(history[-1]["round/task_processes"]) if history else 0.0,
        "train/restarts": float(restarts),  # histogram actors' shares redone after a loss
        # histogram actors started in the data step's last wave (0 on several nodes: train.py)
        "train/actors_started_early": float(started_early),
        "time/data_s": data_s, "time/train_s": train_s,
        # the driver's CPU over the rounds, every thread of it (Ray's own included): the serial
        # share a round cannot divide among workers, whatever their count
        "train/driver_cpu_s": driver_cpu_s,
        **({"train/resumed_from_round": float(first_round)} if f.get("resume") else {}),  # only a resumed run
    })
    return metrics


PHASES = ("bin_cache", "phase1", "phase2", "phase3", "phase4")


def phase_seconds(history: list[dict]) -> dict:
    """Where this run's rounds went: the seconds of each phase over every round
    (``train/phase2_s``: tasks and their partials' sums, ``train/phase3_s``: the actors' split
    search, ...), and ``train/between_phases_s``, the rounds' wall time in no phase (planning,
    the driver's round trips to the actors, waits): the per-round serial share that a many-core
    machine cannot divide, beside the work it can (docs/scaling.md)."""
    out = {f"train/{p}_s": float(sum(m[f"round/{p}_s"] for m in history)) for p in PHASES}
    out["train/between_phases_s"] = max(0.0, float(sum(m["round/total_s"] for m in history)) - sum(out.values()))
    return out
