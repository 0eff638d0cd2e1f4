"""A workload's own ``run(cfg, ctx)`` wired by hand: the peer of ``python -m bench overhead``'s workload rows.

    python -m bench.hand_wired CONFIG.json RESULT.json

What a user writes who has the workload's code but not orchard: ``ray.init()``, an MLflow run
opened with the client (``mlflow.start_run`` without its fluent globals, so workers can log to it
too), and a context object whose every call is the matching MLflow client call in the calling
process (driver or Ray worker). The work is the same as orchard's run of that config, line for
line: the same data, tasks, Ray Train groups, Ray Data pipelines, evaluation, model and figures.
What is not here is orchard's lifecycle: Hydra's composition and the checks (the config comes
composed, as JSON), the run folder and its record, the metrics sink and resource sampler
actors, the heartbeat and leases, the console and the summary.

The script keeps the same time split as orchard (orchard/tracking/time_split.py: the workload marks its
parts through the context, the script marks Ray's start, the store and the close) and writes it
with its wall-clock start to RESULT.json, so both sides' first and last step are read the same
way (bench/orchard_overhead.py).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

from orchard.tracking.context import RunContext


class HandWiredContext(RunContext):
    """The calls a workload's ``run`` makes on its context, each one straight to MLflow: the
    calls that reach orchard's sink actor are replaced; what only shapes a call (a dict or a
    figure into bytes, the time split's marks) is RunContext's own."""

    def __init__(self, tracking_uri: str, run_id: str, run_dir: Path, storage, workload: str, strategy: str):
        super().__init__(None, run_id, str(run_dir), workload, strategy, tracking_uri, storage)
        self._client = None

    def __getstate__(self):
        return {**super().__getstate__(), "_client": None}

    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(self.tracking_uri)
        return self._client

    def log_metrics(self, metrics: dict, step: int | None = None, keep_series: bool = False) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client().log_batch(self.run_id, metrics=[Metric(k, float(v), now, step or 0)
                                                      for k, v in metrics.items() if v is not None])

    def log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        self.client().log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def set_tags(self, tags: dict) -> None:
        from mlflow.entities import RunTag

        self.client().log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, local_path, artifact_path: str | None = None) -> None:
        self.client().log_artifact(self.run_id, str(local_path), artifact_path)

    def log_bytes(self, data: bytes, name: str) -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(name).name
            path.write_bytes(data)
            self.client().log_artifact(self.run_id, str(path), os.path.dirname(name) or None)

    def claim_gpus(self) -> None:  # no resource sampler here to tell
        pass

    def progress(self, step: int, total: int | None = None, desc: str = "", **rates: float) -> None:
        pass  # no progress line: a hand-wired script prints what it prints

    def flush(self) -> None:  # every call above has already written
        pass

    def last_values(self) -> dict:
        return dict(self.client().get_run(self.run_id).data.metrics)


def main(config_path: str, result_path: str) -> None:
    from orchard.tracking.time_split import TimeSplit

    split = TimeSplit()
    cfg = json.loads(Path(config_path).read_text())
    import ray

    c = cfg["cluster"]
    if c["mode"] == "remote":  # a cluster that is already up (the tests: their session's Ray)
        ray.init(address=c["address"])
    else:  # a Ray of its own on this machine, as orchard's embedded one
        ray.init(num_cpus=c.get("num_cpus"), include_dashboard=False)
    split.mark("ray_start")
    from mlflow.tracking import MlflowClient

    from orchard.storage import Storage

    uri, name = cfg["tracking"]["uri"], cfg["workload"]["name"]
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(f"hand-wired-{name}")
    experiment = found.experiment_id if found else client.create_experiment(f"hand-wired-{name}")
    run_id = client.create_run(experiment).info.run_id
    run_dir = Path(cfg["output_dir"]).resolve() / "hand-wired" / run_id
    run_dir.mkdir(parents=True)
    ctx = HandWiredContext(uri, run_id, run_dir, Storage(str(run_dir)), name, cfg["strategy"]["name"])
    ctx.time_split = split
    split.mark("store_open")
    status = "FAILED"
    try:
        metrics = importlib.import_module(f"workloads.{name}.run").run(cfg, ctx)
        ctx.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
        split.mark("close")
        Path(result_path).write_text(json.dumps({"started_at": split.started_at, "parts": split.parts,
                                                 "run_id": run_id, "status": status}))
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
