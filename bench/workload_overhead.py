"""The seconds around each workload's work: orchard's run vs the same run() wired by hand (issue 49).

Part of ``python -m bench overhead`` (bench/orchard_overhead.py). For each workload at
``debug=smoke``, two ends of the run, each side timed from outside its process:

- **command to first step**: from the process's start to the moment its work began;
- **last step to exit**: from the moment its work ended to the process's exit.

Both sides keep orchard's time split (orchard/tracking/time_split.py; the workload marks its own parts
through its context, so the parts are the same code on both sides) and say when it started on
the wall clock (orchard: the run's ``orchard.started_at`` tag; the peer: its result file). The
work is flower's step loops (``steps`` with the ``checkpoints`` and ``validation`` they held; the
Train group's start and its workers' way to their first step come before) and the other
workloads' ``training`` (with ``validation``, which video interleaves); everything the split puts
before the work is before the first step, everything after it after the last.

The peer (bench/hand_wired.py) is the workload's own ``run(cfg, ctx)`` with ``ray.init``, an
MLflow run and a context that calls MLflow directly: the same data, Ray tasks, Train groups,
Ray Data pipelines, evaluation, model and figures. So the rows show orchard's lifecycle (Hydra,
checks, run folder, sink actor, samplers, heartbeat, console, summary, close) and nothing
the workload does inside itself, which both sides pay alike: choices inside the workloads
(how flower logs its model, how its Train group starts) are the profile's business
(``time/split/*`` in docs/runs.md), not this row's.

Fair: the same composed config (the peer reads orchard's composition as JSON, so Hydra is not
its cost), the same output folder, hence the same data caches, both warmed by one untimed run of
each side first; both sides alternate within each repeat; both start their own local Ray on all
cores and write to their own sqlite store (created in the warm-up). Quality: each side's run
status and the workload's headline metric.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEER_LABEL = "the same run() wired by hand: ray.init + an MLflow run (bench/hand_wired.py)"
BEFORE = ("ray_start", "store_open", "data", "worker_group_start", "first_step")
WORK = {"flower": ("steps", "checkpoints", "validation")}
WORK_DEFAULT = ("training", "validation")


def step_window(workload: str, started_at: float, parts: dict[str, float]) -> tuple[float, float]:
    """Wall-clock (first step, last step) of a run whose split began at ``started_at``."""
    first = started_at + sum(parts.get(p, 0.0) for p in BEFORE)
    return first, first + sum(parts.get(p, 0.0) for p in WORK.get(workload, WORK_DEFAULT))


def _timed(cmd: list[str], cwd: Path) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    t_exit = time.time()
    if done.returncode != 0:
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        raise RuntimeError(f"{' '.join(cmd[1:4])} exited {done.returncode}: {lines[-1] if lines else ''}")
    return t0, t_exit, done.stdout


SMOKE = ("debug=smoke",)


def overrides(workload: str, folder: Path, extra: tuple[str, ...] = (), size: tuple[str, ...] = SMOKE) -> list[str]:
    """Both sides' config; ``size``: the run's size (``debug=smoke``, or a preset such as
    ``experiment=flower_gpu``); ``extra``: e.g. a cluster to attach to (the tests: their session's Ray)."""
    return [f"workload={workload}", *size, f"tracking.uri=sqlite:///{folder}/orchard.db",
            f"output_dir={folder}/outputs", "progress=never", *extra]


def orchard_side(workload: str, folder: Path, extra: tuple[str, ...] = (), size: tuple[str, ...] = SMOKE) -> dict:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{folder}/orchard.db"
    t0, t_exit, _ = _timed([sys.executable, "-m", "orchard", *overrides(workload, folder, extra, size)], folder)
    client = MlflowClient(uri)
    run = client.search_runs([e.experiment_id for e in client.search_experiments()],
                             order_by=["attributes.start_time DESC"], max_results=1)[0]
    parts = {k[len("time/split/"):-2]: v for k, v in run.data.metrics.items() if k.startswith("time/split/")}
    return _ends(workload, t0, t_exit, float(run.data.tags["orchard.started_at"]), parts, run.info.status,
                 run.data.metrics)


def peer_config(workload: str, folder: Path, extra: tuple[str, ...] = (), size: tuple[str, ...] = SMOKE) -> Path:
    """orchard's composition of the same overrides, validated, as the JSON the peer reads."""
    from orchard.config import registry
    from orchard.config import compose, validate

    cfg = compose(overrides(workload, folder, extra, size))
    cfg["tracking"]["uri"] = f"sqlite:///{folder}/peer.db"  # a store of its own, like orchard's
    validate(cfg, registry.load(workload))
    path = folder / "peer_config.json"
    path.write_text(json.dumps(cfg, default=str))
    return path


def peer_side(workload: str, folder: Path, config: Path) -> dict:
    from mlflow.tracking import MlflowClient

    result = folder / "peer_result.json"
    result.unlink(missing_ok=True)
    t0, t_exit, _ = _timed([sys.executable, "-m", "bench.hand_wired", str(config), str(result)], folder)
    r = json.loads(result.read_text())
    metrics = MlflowClient(f"sqlite:///{folder}/peer.db").get_run(r["run_id"]).data.metrics
    return _ends(workload, t0, t_exit, r["started_at"], r["parts"], r["status"], metrics)


def _ends(workload: str, t0: float, t_exit: float, started_at: float, parts: dict, status: str, metrics: dict) -> dict:
    from orchard.config import registry

    first, last = step_window(workload, started_at, parts)
    named = getattr(registry.load(workload), "headline_metric", None)
    headline = named(metrics) if named else None
    return {"to_first_step_s": first - t0, "after_last_step_s": t_exit - last, "work_s": last - first,
            "wall_s": t_exit - t0, "status": status, "headline": headline, "metrics": dict(metrics)}


def measure_sides(workload: str, folder: Path, repeats: int, warmup: bool, size: tuple[str, ...] = SMOKE,
                  during=None) -> tuple[list[dict], list[dict]]:
    """orchard's runs and the hand-wired ones of the same config, alternating; ``during(side)``:
    a context manager around each timed run (bench/flower_gpu.py samples the GPU with it)."""
    import contextlib

    during = during or (lambda _side: contextlib.nullcontext())
    folder.mkdir(parents=True, exist_ok=True)
    config = peer_config(workload, folder, size=size)
    if warmup:  # data caches, each store's schema, numba's cache, the OS file cache: once for both
        orchard_side(workload, folder, size=size)
        peer_side(workload, folder, config)
    ours, peers = [], []
    for _ in range(repeats):  # alternate, so a change of load hits both
        with during("orchard") as seen:
            ours.append(orchard_side(workload, folder, size=size))
        ours[-1]["during"] = seen
        with during("peer") as seen:
            peers.append(peer_side(workload, folder, config))
        peers[-1]["during"] = seen
        print(f"  overhead {workload}: orchard {_brief(ours[-1])}, hand-wired {_brief(peers[-1])}", flush=True)
    return ours, peers


def _brief(side: dict) -> dict:
    return {k: v for k, v in side.items() if k not in ("metrics", "during")}


def measure_workload(workload: str, folder: Path, repeats: int, warmup: bool, size: tuple[str, ...] = SMOKE,
                     name: str | None = None) -> list[dict]:
    """The two rows of one workload: command to first step, last step to exit."""
    ours, peers = measure_sides(workload, folder, repeats, warmup, size)
    return end_rows(name or f"{workload} smoke run", " ".join(["python -m orchard", f"workload={workload}", *size]),
                    ours, peers)


def end_rows(name: str, label: str, ours: list[dict], peers: list[dict]) -> list[dict]:
    """The rows "<name>: command to first step" and "<name>: last step to exit"."""
    from bench.rows import row

    def quality(side: list[dict]) -> dict:
        last = side[-1]
        out = {"status": f"{sum(s['status'] == 'FINISHED' for s in side)}/{len(side)} FINISHED",
               "work s": sorted(s["work_s"] for s in side)[len(side) // 2]}
        if last["headline"]:
            out[last["headline"][0]] = last["headline"][1]
        return out

    return [row(f"{name}: {part}", "s", [s[key] for s in ours], [s[key] for s in peers],
                higher_is_better=False, orchard_label=label, peer_label=PEER_LABEL,
                quality={"orchard": quality(ours), "peer": quality(peers)},
                target={"text": "orchard <= 1.0x the hand-wired script", "min_ratio": 1.0})
            for part, key in (("command to first step", "to_first_step_s"), ("last step to exit", "after_last_step_s"))]
