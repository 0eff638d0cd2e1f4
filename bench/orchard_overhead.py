"""orchard's own overhead, side by side with wiring Ray + MLflow by hand.

1. Seconds from the command to the workload's first step:
   `python -m orchard workload=bench_first_step` vs a plain script that calls ray.init(),
   mlflow.start_run() and then takes its first step.
2. Per-step cost of the metrics API: ``ctx.log_metrics`` (one fire-and-forget message to the
   run's sink actor) vs ``mlflow.log_metrics`` straight into the same kind of sqlite store.

    python bench/orchard_overhead.py            # ~1 minute on 2 cores
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
sys.path.insert(0, {repo!r}); sys.path.insert(0, {bench!r})
from orchard import register_workload
register_workload("bench_first_step", "orchard_overhead", {conf!r})
from orchard.cli import main
main()
"""

PLAIN_CMD = """
import os, time, ray, mlflow
ray.init(num_cpus=2, include_dashboard=False)
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
    subprocess.run([sys.executable, "-c", code, *args], cwd=tmp, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(marker.read_text()) - t0


def per_step_overhead(tmp: Path, n: int = 2000) -> tuple[float, float]:
    import mlflow
    import ray

    from orchard.context import RunContext
    from orchard.metrics_sink import MetricsSink
    from orchard.tracking import ensure_experiment

    uri = f"sqlite:///{tmp}/steps.db"
    client = mlflow.tracking.MlflowClient(uri)
    exp = ensure_experiment(client, "steps", None)
    run_id = client.create_run(exp).info.run_id
    ray.init(num_cpus=2, include_dashboard=False)
    sink = MetricsSink.remote(uri, run_id, 1.0)
    ctx = RunContext(sink, run_id, str(tmp), "bench", "tasks")
    ctx.flush()
    t0 = time.perf_counter()
    for i in range(n):
        ctx.log_metrics({"train/loss": 1.0 / (i + 1), "throughput/samples_per_s": 100.0}, step=i)
    orchard_us = (time.perf_counter() - t0) / n * 1e6
    ctx.flush()
    ray.shutdown()
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("plain-steps")
    m = n // 10  # direct sqlite writes are slow; fewer calls give the same per-call figure
    with mlflow.start_run():
        t0 = time.perf_counter()
        for i in range(m):
            mlflow.log_metrics({"train/loss": 1.0 / (i + 1), "throughput/samples_per_s": 100.0}, step=i)
        mlflow_us = (time.perf_counter() - t0) / m * 1e6
    return orchard_us, mlflow_us


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        conf = tmp / "conf"
        (conf / "workload").mkdir(parents=True)
        (conf / "workload" / "bench_first_step.yaml").write_text(WORKLOAD_YAML)
        orchard_code = ORCHARD_CMD.format(repo=str(REPO), bench=str(REPO / "bench"), conf=str(conf))
        args = ["workload=bench_first_step", "cluster.num_cpus=2", f"tracking.uri=sqlite:///{tmp}/orchard.db"]
        plain_code = PLAIN_CMD.format(uri=f"sqlite:///{tmp}/plain.db")
        # warm the OS file cache and MLflow's schema creation once for both
        time_to_first_step(plain_code, [], tmp)
        orchard_s = [time_to_first_step(orchard_code, args, tmp) for _ in range(3)]
        plain_s = [time_to_first_step(plain_code, [], tmp) for _ in range(3)]
        o, p = sorted(orchard_s)[1], sorted(plain_s)[1]
        print(f"time to first step (median of 3): orchard {o:.2f} s, plain ray.init+mlflow {p:.2f} s, ratio {o / p:.2f}x")
        orchard_us, mlflow_us = per_step_overhead(tmp)
        print(f"metrics API per call (2 metrics): orchard ctx.log_metrics {orchard_us:.0f} us, "
              f"mlflow.log_metrics to sqlite {mlflow_us:.0f} us, ratio {orchard_us / mlflow_us:.3f}x")


if __name__ == "__main__":
    main()
