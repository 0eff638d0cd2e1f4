"""What the workers' summaries say, read on the driver after training: the thesis's Table 5.2
(throughput mean/std/var over the steady steps, the completion time = the slowest worker's
training time, 4.2), where the training wall time went, and what the node caches evicted.

Each worker writes its summary as ``workers/rank<r>.json`` in the run storage at the end of
``train.train_loop``; they come back through storage, never a driver path.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def worker_metrics(run_storage, warmup_steps: int, train_started: float, driver_evicted: int) -> dict[str, float]:
    """The run's training figures from the workers' summaries (workers/rank<r>.json: they come
    back through storage, never a driver path): throughput, completion and start-up times, and
    what the node caches evicted (the driver's ``driver_evicted`` bytes and the workers')."""
    summaries = [run_storage.read_json(f"workers/{name}") for name in run_storage.list("workers")
                 if name.startswith("rank") and name.endswith(".json")]
    metrics = throughput_stats(summaries, warmup_steps)
    metrics.update(time_split(summaries, train_started))
    metrics["cache/evicted_bytes"] = cache_evicted(summaries, driver_evicted)
    return metrics


def throughput_stats(worker_files: list, warmup_steps: int) -> dict[str, float]:
    """Table 5.2 figures from the workers' per-step series, plus the completion time.

    The run's throughput at step i is the sum of every worker's images/s at its step i; the
    first `warmup_steps` steps (graph building, first all-reduce) are left out of mean/std/var.
    """
    summaries = [p if isinstance(p, dict) else json.loads(Path(p).read_text()) for p in worker_files]
    if not summaries:
        raise RuntimeError("no worker wrote its summary: training did not finish")
    length = min(len(s["throughput"]) for s in summaries)
    total = np.sum([np.asarray(s["throughput"][:length]) for s in summaries], axis=0)
    steady = total[warmup_steps:] if length > warmup_steps else total
    out = {"time/completion_s": max(s["completion_s"] for s in summaries),
           "throughput/mean_images_per_s": float(np.mean(steady)) if steady.size else float("nan"),
           "throughput/std_images_per_s": float(np.std(steady)) if steady.size else float("nan"),
           "throughput/var_images_per_s": float(np.var(steady)) if steady.size else float("nan"),
           "train/workers": float(len(summaries))}
    first_epoch = max(s["first_epoch"] for s in summaries)
    if first_epoch > 0:  # the group went on from a checkpoint (a resume, or a worker died: FailureConfig)
        out["train/resumed_from_epoch"] = float(first_epoch)  # a fresh run has no such metric
    for s in summaries:
        out[f"time/w{s['rank']}_completion_s"] = s["completion_s"]
        util = s.get("gpu_util") or []
        if util:
            out[f"system/w{s['rank']}_gpu_util_pct_mean"] = float(np.mean(util))
            out[f"system/w{s['rank']}_gpu_util_pct_std"] = float(np.std(util))
    return out


def cache_evicted(summaries: list[dict], driver_bytes: int) -> float:
    """``cache/evicted_bytes``: what the node caches evicted for this run (least recently used
    copies removed past ``storage.node_cache_max_gb``), the driver's ``driver_bytes`` and each
    Train worker's; a worker in the driver's own process (Train's local mode) is counted once."""
    return float(driver_bytes + sum(int(s.get("cache_evicted_bytes", 0)) for s in summaries
                                    if s.get("pid") != os.getpid()))


def time_split(summaries: list[dict], train_started: float) -> dict[str, float]:
    """Where the training wall time went: until the first step of any worker (Ray Train's start,
    worker start-up, the shard load), then the slowest worker's loop (the one whose
    ``completion_s`` is the run's): its start until its step loops begin, its step loops (and the
    CPU time its process had in them, ``time/steps_cpu_s``: less than ``time/steps_s`` where it
    waited for a core, more where its threads ran side by side), its checkpoints
    (the report every rank makes, rank 0 writing) and, with more than one worker, its steps' waits
    on the network (``time/comm_wait_s``: the ring's last all-reduce, or the parameter servers'
    push and pull) with the bytes one step sends and receives (``wire/bytes_per_step``); rank 0's
    validation."""
    firsts = [s["first_step_at"] for s in summaries if s.get("first_step_at")]
    slowest = max(summaries, key=lambda s: s["completion_s"], default={})
    out = {"time/steps_s": float(slowest.get("steps_s", 0.0))}
    if firsts:
        out["time/train_start_s"] = min(firsts) - train_started
    for key, metric in (("loop_start_s", "time/loop_start_s"), ("checkpoint_s", "time/checkpoint_s"),
                        ("steps_cpu_s", "time/steps_cpu_s")):
        if key in slowest:
            out[metric] = float(slowest[key])
    # the replica's network figures are named as metrics already (orchard/strategies/worker.py comm_stats)
    out.update({key: float(slowest[key]) for key in ("time/comm_wait_s", "wire/bytes_per_step") if key in slowest})
    validation = [float(s["validation_s"]) for s in summaries if s.get("validation_s")]
    if validation:
        out["time/validation_s"] = max(validation)
    return out


def training_parts(metrics: dict[str, float]) -> dict[str, float]:
    """The training part of the run's time split (orchard/tracking/time_split.py), as the slowest worker
    measured it: the group's start (launch until its loop function ran), that function's start
    until the first step, the steps, checkpoints and validation; what is left (Ray Train's
    teardown, the reports) stays ``training``."""
    start, loop = metrics.get("time/train_start_s"), metrics.get("time/loop_start_s", 0.0)
    # the group's start last: it is the only piece that compares two processes' wall clocks (the
    # driver's launch, a worker's first step), so a step of the clock between them (a VM paused and
    # resumed, NTP) takes only what the pieces one worker timed itself leave (carve never exceeds
    # the part), instead of the steps' seconds (a bench run once logged no steps at all)
    return {"first_step": loop if start is not None else 0.0,
            "steps": metrics.get("time/steps_s", 0.0), "checkpoints": metrics.get("time/checkpoint_s", 0.0),
            "validation": metrics.get("time/validation_s", 0.0),
            "worker_group_start": max((start or 0.0) - loop, 0.0)}
