"""MLflow run lifecycle on the driver: experiment, run, params, tags, config artifact, status.

Metrics during the run go through ``MetricsSink``; this module opens and closes the run; the store
it writes to (its check, retried writes, the UI's address) is ``tracking_store.py``.  The
experiment is tagged as model training, so the MLflow UI opens it on its runs table (MLflow 3
shows an experiment without a kind in its GenAI view: traces, judges, prompts).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from orchard import config as config_lib
from orchard.config import redact
from orchard.tracking.lost_runs import driver_tags
from orchard.tracking.store import resolve_uri, retried, store_lock

# The experiment tag MLflow 3's UI reads to pick an experiment's view, and the value of its
# "Model training" view; MLflow names no constant for either in its Python package.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"

# Config keys that are bookkeeping rather than knobs; kept out of the run's params.
_NOT_PARAMS = ("_choices",)
# Tags that say how orchard ran a run (its driver, folder, clock, the versions it ran with), not
# what the run is. MLflow 3.17's UI lists a run's tags (its page, its runs table's columns) in the
# order the store first recorded them, sorting none by name, so no prefix puts these last: the
# run's end writes them again after the workload's own (``operational_tags_last``).
OPERATIONAL_TAGS = ("orchard.host", "orchard.boot_id", "orchard.pid_ns", "orchard.pid", "orchard.pid_start",
                    "orchard.heartbeat", "orchard.clock_skew_s", "orchard.started_at", "orchard.run_dir",
                    "orchard.overrides", "orchard.config_dirs", "orchard.trial_id", "orchard.sweep_session",
                    "orchard.trial_attempt", "orchard.trial_log", "orchard.reopened_after_reap", "orchard.mlflow_version",
                    "ray.version", "torch.version", "numpy.version")

# "<offset>:<path>" of a sweep trial's part of its process's log (run/lifecycle.py), for the
# sweep's driver to copy when Tune kills the trial before its run closes (sweep/trials.py)
TRIAL_LOG_TAG = "orchard.trial_log"


@dataclass
class TrackedRun:
    run_id: str
    experiment_id: str
    tracking_uri: str

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.tracking_uri)


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def _versions() -> dict[str, str]:
    """``<package>.version`` tags; MLflow's own is ``orchard.mlflow_version``, since ``mlflow.*``
    is MLflow's namespace (each logged model also records it in its MLmodel)."""
    import importlib.metadata as md

    out = {}
    for pkg in ("ray", "torch", "mlflow", "numpy"):
        try:
            out["orchard.mlflow_version" if pkg == "mlflow" else f"{pkg}.version"] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def ensure_experiment(client, name: str, artifact_location: str | None) -> str:
    """The experiment's id, created if needed, tagged as model training unless the user gave it
    another kind (the MLflow UI then opens it on its runs, not on GenAI traces)."""
    with store_lock(client.tracking_uri):
        exp = retried(client.get_experiment_by_name, name)
        if exp is not None:
            if EXPERIMENT_KIND_TAG not in exp.tags:  # an experiment made before, or by hand
                retried(client.set_experiment_tag, exp.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
            return exp.experiment_id
        location = artifact_root(client.tracking_uri, artifact_location)
        try:
            return retried(client.create_experiment, name, artifact_location=location,
                           tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
        except Exception:  # created meanwhile by a process on another machine (server stores)
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def artifact_root(tracking_uri: str, artifact_location: str | None) -> str | None:
    """Where a new experiment's artifacts go: ``tracking.artifact_location`` as a URI; a local
    folder made its owner's alone (orchard/config/redact.py). A server's store (http/https) takes no
    folder of this machine: it would be the first user's disk for every teammate, so the
    server's own artifact root (None) serves instead."""
    if not artifact_location or "://" in artifact_location:
        return artifact_location or None
    if tracking_uri.startswith(("http://", "https://")):
        return None
    return redact.private_folder(Path(artifact_location).resolve()).as_uri()


def open_run(cfg: dict, run_name: str, parent_run_id: str | None = None, extra_tags: dict | None = None) -> TrackedRun:
    """Create the MLflow run: params = flattened config, tags, its description (what the run
    is, in one line), its data as a dataset input, and the ``config.yaml`` artifact."""
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NOTE, MLFLOW_SOURCE_NAME

    from orchard.tracking import summary
    from orchard.tracking import datasets

    tcfg = cfg["tracking"]
    uri = resolve_uri(tcfg["uri"])
    client = MlflowClient(uri)
    experiment = tcfg.get("experiment") or cfg["workload"]["name"]
    exp_id = ensure_experiment(client, experiment, tcfg.get("artifact_location"))
    tags = {
        "orchard.workload": cfg["workload"]["name"],
        "orchard.strategy": cfg["strategy"]["name"],
        "orchard.command": "python -m orchard " + " ".join(redact.overrides(cfg.get("_overrides", []))),
        MLFLOW_GIT_COMMIT: git_commit(),
        MLFLOW_SOURCE_NAME: "orchard",
        **_versions(),
        **driver_tags(),
        **(extra_tags or {}),
    }
    if parent_run_id:
        tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
    # what everyone who reads the store sees: secrets masked (orchard/config/redact.py); the run has the real ones
    plain = redact.config({k: v for k, v in cfg.items() if k not in _NOT_PARAMS and not k.startswith("_")})
    flat = {k: str(v)[:6000] for k, v in config_lib.flatten(plain).items()}
    parent_params = retried(client.get_run, parent_run_id).data.params if parent_run_id else None
    tags[MLFLOW_RUN_NOTE] = summary.description(cfg, summary.trial_values(flat, parent_params))
    run = retried(client.create_run, exp_id, run_name=run_name, tags=tags)
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in sorted(flat.items(), key=lambda kv: param_order(cfg["workload"]["name"], kv[0]))]
    for i in range(0, len(params), 100):
        retried(client.log_batch, run_id, params=params[i:i + 100])
    retried(client.log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    log_config(client, run_id, plain)
    if cfg.get("mode", "train") == "train":
        datasets.log_training_data(client, run_id, cfg)
    return TrackedRun(run_id, exp_id, uri)


def param_order(workload: str, key: str) -> tuple[int, str]:
    """Where a param goes in the run's list: the run page's Parameters table shows them in the
    order they were logged (MLflow 3.17 sorts none), so the workload's own hyper-parameters come
    first, then the strategy's, then the rest (cluster, tracking, storage, ...), each by name."""
    lead = (f"{workload}.", "strategy.")
    return next((i for i, prefix in enumerate(lead) if key.startswith(prefix)), len(lead)), key


def reopen_run(cfg: dict, run_id: str, attempt: int, extra_tags: dict | None = None) -> TrackedRun:
    """A sweep trial's run again RUNNING, driven by this process: the retry of an attempt whose
    process was lost with its node (orchard/sweep/trials.py, ``retry_of``). Params, config and data
    stay as the first attempt logged them (the same trial config); the run gets this driver's
    tags, the attempt's number and ``trial/retries``, and loses the reaper's "driver lost"."""
    from mlflow.entities import Metric, RunTag

    from mlflow.tracking import MlflowClient

    from orchard.tracking.lost_runs import TAG_ERROR

    uri = resolve_uri(cfg["tracking"]["uri"])
    client = MlflowClient(uri)
    run = retried(client.get_run, run_id)
    if run.info.status != "RUNNING":
        retried(client.update_run, run_id, status="RUNNING")
    if TAG_ERROR in run.data.tags:
        retried(client.delete_tag, run_id, TAG_ERROR)
    tags = {**driver_tags(), **(extra_tags or {}), "orchard.trial_attempt": str(attempt)}
    retried(client.log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()],
            metrics=[Metric("trial/retries", float(attempt - 1), int(time.time() * 1000), attempt - 1)])
    return TrackedRun(run_id, run.info.experiment_id, uri)


def log_config(client, run_id: str, cfg: dict) -> None:
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        retried(client.log_artifact, run_id, str(path))


def close_run(run: TrackedRun, status: str, error: BaseException | None = None) -> None:
    """End the run with ``status`` (FINISHED | FAILED | KILLED), recording the error if any."""
    client = run.client()
    try:
        if error is not None:  # an error may quote a URI with its password: masked like the rest
            reason = redact.text(f"{type(error).__name__}: {error}".strip())
            retried(client.set_tag, run.run_id, "orchard.error", reason[:5000])
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "error.txt"
                path.write_text(redact.text("".join(traceback.format_exception(type(error), error, error.__traceback__))))
                retried(client.log_artifact, run.run_id, str(path))
    finally:  # the status above all: a run left RUNNING is later reaped as "driver lost"
        retried(client.set_terminated, run.run_id, status=status)
    try:
        operational_tags_last(client, run.run_id)
    except Exception:  # noqa: BLE001 - only their order on the run's page: the run is closed
        pass


def operational_tags_last(client, run_id: str) -> list[str]:
    """Write the run's ``OPERATIONAL_TAGS`` again after its other tags, in their order, so its
    page in the MLflow UI leads with what the run is (workload, strategy, command, the workload's
    own tags, its model). Done once the run is closed: no heartbeat writes them meanwhile, and no
    reaper looks at a run that is not RUNNING. Returns the keys moved."""
    from mlflow.entities import RunTag

    tags = retried(client.get_run, run_id).data.tags
    moved = [k for k in tags if k in OPERATIONAL_TAGS]
    try:
        for key in moved:
            try:
                retried(client.delete_tag, run_id, key)
            except Exception:  # noqa: BLE001 - gone already (a delete retried after it landed)
                pass
    finally:  # whatever happened above, every one of them is on the run again
        if moved:
            retried(client.log_batch, run_id, tags=[RunTag(k, tags[k]) for k in moved])
    return moved


def in_notebook_or_tty() -> bool:
    return sys.stdout.isatty() or "JPY_PARENT_PID" in os.environ
