"""orchard's own overhead, side by side with wiring Ray + MLflow by hand.

    python -m bench overhead            # ~18 minutes on 2 idle cores (3 repeats)

1. Seconds from the command to the workload's first step: `python -m orchard
   workload=bench_first_step` (Hydra composition, validation, embedded Ray, an MLflow run with the
   resolved config, the metrics sink actor, the samplers) vs a plain script that calls ray.init(),
   mlflow.start_run() and takes its first step. Fair: both are fresh Python processes on the same
   machine, both start a local Ray with 2 CPUs and open a run in a sqlite store of their own; the
   two alternate within each repeat after one warm-up of each (OS file cache, store creation).
   Quality: both steps' metric read back from each store.
2. Per-call cost of the metrics API: ``ctx.log_metrics`` (one fire-and-forget message to the run's
   sink actor, which batches writes) vs ``mlflow.log_metrics`` straight into a sqlite store, the
   way a hand-wired script logs, and vs MLflow's own asynchronous logging
   (``mlflow.log_metrics(..., synchronous=False)``, the peer a user would pick for calls that must
   not wait), the same number of calls, each side after one untimed call of its own (the sink actor
   up, the sqlite connection open, MLflow's async queue thread started). Quality: the values found
   in each store afterwards (read back with the same ``MlflowClient.get_metric_history``), out of
   those logged (orchard's sink and MLflow's async queue are flushed first, with
   ``mlflow.flush_async_logging()``, and the flush's seconds stand beside each), so a cheaper call
   that drops metrics or defers the work shows.
3. Each workload's smoke run, command to first step and last step to exit, against the same
   ``run()`` wired by hand (ray.init + an MLflow run): bench/workload_overhead.py says how.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# --- the workload used for (1): it writes the wall time of its first step and stops --------
STRATEGIES = ("tasks",)


def run(cfg, ctx):
    Path(os.environ["FIRST_STEP_FILE"]).write_text(repr(time.time()))
    ctx.log_metrics({"train/loss": 1.0}, step=0)
    return {"train/loss": 1.0}


WORKLOAD_YAML = """# @package _global_
defaults:
  - override /strategy: tasks
workload:
  name: bench_first_step
"""

ORCHARD_CMD = """
import sys
sys.path.insert(0, {repo!r})
from orchard import register_workload
register_workload("bench_first_step", "bench.orchard_overhead", {conf!r})
from orchard.cli import main
main()
"""

PLAIN_CMD = """
import os, time, ray, mlflow
ray.init(address="local", num_cpus=2, include_dashboard=False)
mlflow.set_tracking_uri({uri!r})
mlflow.set_experiment("plain")
with mlflow.start_run():
    open(os.environ["FIRST_STEP_FILE"], "w").write(repr(time.time()))
    mlflow.log_metric("train/loss", 1.0, step=0)
ray.shutdown()
"""


def time_to_first_step(code: str, args: list[str], tmp: Path) -> float:
    marker = tmp / "first_step"
    marker.unlink(missing_ok=True)
    env = {**os.environ, "FIRST_STEP_FILE": str(marker)}
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp, env=env, check=False,
                          capture_output=True, text=True)
    if done.returncode != 0 or not marker.exists():
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        raise RuntimeError(f"{'orchard' if args else 'plain script'} exited {done.returncode}: "
                           f"{lines[-1] if lines else ''}")
    return float(marker.read_text()) - t0


WARMUP_KEY = "bench/warmup"


def per_step_overhead(tmp: Path, n: int) -> dict:
    """Microseconds per call and metric values found afterwards, orchard's sink vs plain MLflow."""
    import mlflow
    import ray

    from bench.machine import start_ray
    from orchard import cluster
    from orchard.tracking.context import RunContext
    from orchard.tracking.sink import MetricsSink
    from orchard.tracking.mlflow_run import ensure_experiment

    uri = f"sqlite:///{tmp}/steps.db"
    client = mlflow.tracking.MlflowClient(uri)
    exp = ensure_experiment(client, "steps", None)
    run_id = client.create_run(exp).info.run_id
    cluster.prepare_local_env()
    start_ray(num_cpus=2)
    sink = MetricsSink.remote(uri, run_id, 1.0)
    ctx = RunContext(sink, run_id, str(tmp), "bench", "tasks")
    # every side's first call is untimed (its own key, not counted): actor, connection, thread up
    ctx.log_metrics({WARMUP_KEY: 0.0}, step=0)
    ctx.flush()
    t0 = time.perf_counter()
    for i in range(n):
        ctx.log_metrics({"train/loss": 1.0 / (i + 1), "throughput/samples_per_s": 100.0}, step=i)
    orchard_us = (time.perf_counter() - t0) / n * 1e6
    t1 = time.perf_counter()
    ctx.flush()
    orchard_flush_s = time.perf_counter() - t1
    ray.shutdown()
    orchard_found = len(client.get_metric_history(run_id, "train/loss"))
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("plain-steps")
    m = max(n // 10, 10)  # direct sqlite writes are slow; fewer calls give the same per-call figure
    with mlflow.start_run() as plain:
        mlflow.log_metrics({WARMUP_KEY: 0.0}, step=0)
        t0 = time.perf_counter()
        for i in range(m):
            mlflow.log_metrics({"train/loss": 1.0 / (i + 1), "throughput/samples_per_s": 100.0}, step=i)
        mlflow_us = (time.perf_counter() - t0) / m * 1e6
    plain_found = len(client.get_metric_history(plain.info.run_id, "train/loss"))
    # MLflow's own asynchronous logging, the peer a user would pick for fire-and-forget calls:
    # the same n calls, then its queue flushed, the values read back the same way
    mlflow.set_experiment("async-steps")
    with mlflow.start_run() as run_async:
        mlflow.log_metrics({WARMUP_KEY: 0.0}, step=0, synchronous=False)  # starts its queue's thread
        mlflow.flush_async_logging()
        t0 = time.perf_counter()
        for i in range(n):
            mlflow.log_metrics({"train/loss": 1.0 / (i + 1), "throughput/samples_per_s": 100.0}, step=i,
                               synchronous=False)
        async_us = (time.perf_counter() - t0) / n * 1e6
        t1 = time.perf_counter()
        mlflow.flush_async_logging()
        async_flush_s = time.perf_counter() - t1
    async_found = len(client.get_metric_history(run_async.info.run_id, "train/loss"))
    return {"orchard_us": orchard_us, "mlflow_us": mlflow_us, "orchard_found": f"{orchard_found}/{n}",
            "mlflow_found": f"{plain_found}/{m}", "async_us": async_us, "async_found": f"{async_found}/{n}",
            "orchard_flush_s": orchard_flush_s, "async_flush_s": async_flush_s}


def metric_found(uri: str) -> str:
    """'k/k': runs in the store whose first-step metric is there, out of all runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return f"{sum('train/loss' in r.data.metrics for r in runs)}/{len(runs)}"


SIZES = {"full": {"warmup": True, "calls": 2000, "workloads": ["flower", "forest", "video", "singa"]},
         "smoke": {"warmup": False, "calls": 50, "workloads": ["forest"]}}
ESTIMATE = "~2 min on 2 idle cores, and ~4 min per workload (3 repeats)"


def measure(size: dict, repeats: int) -> list[dict]:
    from bench.rows import row

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        conf = tmp / "conf"
        (conf / "workload").mkdir(parents=True)
        (conf / "workload" / "bench_first_step.yaml").write_text(WORKLOAD_YAML)
        orchard_code = ORCHARD_CMD.format(repo=str(REPO), conf=str(conf))
        orchard_uri, plain_uri = f"sqlite:///{tmp}/orchard.db", f"sqlite:///{tmp}/plain.db"
        args = ["workload=bench_first_step", "cluster.num_cpus=2", f"tracking.uri={orchard_uri}"]
        plain_code = PLAIN_CMD.format(uri=plain_uri)
        if size["warmup"]:  # the OS file cache and each store's schema, once for both
            time_to_first_step(plain_code, [], tmp)
            time_to_first_step(orchard_code, args, tmp)
        orchard_s, plain_s = [], []
        for _ in range(repeats):  # alternate, so a change of load hits both
            orchard_s.append(time_to_first_step(orchard_code, args, tmp))
            plain_s.append(time_to_first_step(plain_code, [], tmp))
        first = row("time from command to first step", "s", orchard_s, plain_s, higher_is_better=False,
                    orchard_label="python -m orchard", peer_label="ray.init + mlflow.start_run by hand",
                    quality={"orchard": {"first-step metric in store": metric_found(orchard_uri)},
                             "peer": {"first-step metric in store": metric_found(plain_uri)}})
        calls = []
        for i in range(repeats):
            (tmp / f"r{i}").mkdir()
            calls.append(per_step_overhead(tmp / f"r{i}", size["calls"]))
        api = row("metrics API, one call with 2 metrics", "us", [c["orchard_us"] for c in calls],
                  [c["mlflow_us"] for c in calls], higher_is_better=False,
                  orchard_label="ctx.log_metrics (to the sink actor)", peer_label="mlflow.log_metrics to sqlite",
                  quality={"orchard": {"values in store": calls[-1]["orchard_found"]},
                           "peer": {"values in store": calls[-1]["mlflow_found"]}})
        api_async = row("metrics API, one call with 2 metrics, vs MLflow's async logging", "us",
                        [c["orchard_us"] for c in calls], [c["async_us"] for c in calls], higher_is_better=False,
                        orchard_label="ctx.log_metrics (to the sink actor)",
                        peer_label="mlflow.log_metrics(synchronous=False) to sqlite",
                        quality={"orchard": {"values in store": calls[-1]["orchard_found"],
                                             "flush s": calls[-1]["orchard_flush_s"]},
                                 "peer": {"values in store": calls[-1]["async_found"],
                                          "flush s": calls[-1]["async_flush_s"]}})
        # 3. each workload's smoke run against its own run() wired by hand (bench/workload_overhead.py)
        from bench.workload_overhead import measure_workload

        per_workload = [r for w in size["workloads"]
                        for r in measure_workload(w, tmp / w, repeats, size["warmup"])]
    return [first, api, api_async, *per_workload]
