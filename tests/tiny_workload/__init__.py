"""A tiny workload that exists only to test orchard's core: it fits y = a*x + b by gradient
descent on the driver, then again in a Ray task, logging metrics from both, an artifact and
a figure.  Registered by tests/conftest.py, never shipped in workloads/.
"""
from __future__ import annotations

import time
from pathlib import Path

from orchard import ConfigError
from orchard.config import require_path, require_positive

STRATEGIES = ("ring", "ps", "tasks")
CONFIG_DIR = str(Path(__file__).parent / "conf")


def validate(cfg: dict) -> None:
    require_positive(cfg, "tiny.steps", integer=True)
    require_positive(cfg, "tiny.lr")
    require_path(cfg, "tiny.data_dir", kind="dir")
    if cfg["tiny"]["lr"] >= 1.0:
        raise ConfigError("tiny.lr", f"a learning rate below 1.0 (larger diverges), got {cfg['tiny']['lr']}")


def resources(cfg: dict):
    """What a run holds: one CPU for its Ray task, and ``tiny.gpus`` of a GPU beside it when set
    (a trial's share of a GPU, as a single-worker flower trial's ``strategy.gpus_per_worker``)."""
    from orchard.api import Resources, bundles

    return Resources(in_trial=bundles(1, 1.0, float(cfg["tiny"].get("gpus") or 0.0)))


def check(cfg: dict) -> None:
    """The check that needs heavy libraries (singa builds its net): run while Ray starts."""
    if cfg["tiny"].get("check_fails"):
        raise ConfigError("tiny.check_fails", "false (the workload's check refused it, tiny.check_fails=true)")


def _fit(steps: int, lr: float, seed: int, ctx, prefix: str, sleep_s: float = 0.0) -> float:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, 256)
    y = 3.0 * x + 0.5 + rng.normal(0, 0.05, x.size)
    a = b = 0.0
    loss = float("nan")
    for step in range(steps):
        err = a * x + b - y
        loss = float(np.mean(err**2))
        a -= lr * float(np.mean(2 * err * x))
        b -= lr * float(np.mean(2 * err))
        ctx.log_metrics({f"{prefix}/loss": loss}, step=step)
        ctx.progress(step + 1, steps, desc=prefix, **{"steps/s": 1000.0})
        if sleep_s:
            time.sleep(sleep_s)
    return loss


def draw_line(ctx, *, points: list[float], fail: bool, pause_s: float = 0.0) -> float:
    """A figure drawn in a Ray task (``ctx.draw``, ``tiny.draw``), ``pause_s`` late; returns the
    points' sum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if fail:
        raise ValueError("tiny drawing asked to fail (tiny.draw=fail)")
    time.sleep(pause_s)
    fig, ax = plt.subplots()
    ax.plot(points)
    ctx.log_figure(fig, "figures/drawn.png")
    plt.close(fig)
    return float(sum(points))


def _held_on_gpu(ctx, memory: dict | None) -> None:
    """What a worker on a GPU logs of the memory it holds (orchard/tracking/gpu_peak.py), as
    ``tiny.gpu_memory`` says: the one thing here that stands in for a GPU."""
    if memory:
        from orchard.tracking import gpu_peak

        peak, other, total = gpu_peak.keys(0)
        ctx.log_metrics({other: memory["other_mb"], total: memory["total_mb"]}, step=0)
        ctx.log_metrics({peak: memory["torch_peak_mb"]}, step=0)


def _worker_fit(ctx, t: dict, seed: int) -> tuple[float, int]:
    """The fit again in a Ray task (holding ``tiny.gpus`` of a GPU): its loss, and how many GPU ids Ray gave it."""
    import ray

    _held_on_gpu(ctx, t.get("gpu_memory"))
    loss = _fit(t["steps"], t["lr"], seed, ctx, "worker")
    ctx.flush()
    return loss, len(ray.get_gpu_ids())


def run(cfg: dict, ctx) -> dict[str, float]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import ray

    t = cfg["tiny"]
    if t.get("fail"):
        raise RuntimeError("tiny workload asked to fail (tiny.fail=true)")
    if t.get("bad_data"):
        raise ConfigError("tiny.data_dir", "a folder with at least one usable sample; none was (tiny.bad_data=true)")
    started = time.time()
    driver_loss = _fit(t["steps"], t["lr"], cfg["seed"], ctx, "train", t.get("sleep_s", 0.0))
    # The same fit inside a Ray task: its metrics must land in the same MLflow run.
    remote_fit = ray.remote(num_cpus=0, num_gpus=float(t.get("gpus") or 0.0))(_worker_fit)
    worker_loss, gpus_seen = ray.get(remote_fit.remote(ctx, t, cfg["seed"] + 1))
    (ctx.run_dir / "note.txt").write_text(f"driver loss {driver_loss}\n")
    ctx.log_artifact(ctx.run_dir / "note.txt", "notes")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [driver_loss, worker_loss])
    ctx.log_figure(fig, "figures/loss.png")
    plt.close(fig)
    if t.get("draw"):  # drawn in a task and never waited for here: the lifecycle must
        ctx.draw(draw_line, points=[driver_loss, worker_loss], fail=t["draw"] == "fail", pause_s=1.0)
    steps = t["steps"]
    extra = {t["returns_metric"]: 1.0} if t.get("returns_metric") else {}
    if t.get("gpus"):  # the GPU ids Ray gave the task: its share of the trial's reservation
        extra["worker/gpus_seen"] = float(gpus_seen)
    return {"train/final_loss": driver_loss, "worker/final_loss": worker_loss, **extra,
            "val/score": -driver_loss, "throughput/steps_per_s": steps / max(time.time() - started, 1e-9)}
