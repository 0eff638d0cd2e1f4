"""MLflow run lifecycle on the driver: experiment, run, params, tags, config artifact, status.

Metrics during the run go through ``MetricsSink``; this module opens and closes the run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchard import config as config_lib
from orchard.runs import driver_tags

# Config keys that are bookkeeping rather than knobs; kept out of the run's params.
_NOT_PARAMS = ("_choices",)


@dataclass
class TrackedRun:
    run_id: str
    experiment_id: str
    tracking_uri: str

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.tracking_uri)


def resolve_uri(uri: str) -> str:
    """Make a relative sqlite path absolute so Ray actors in other folders write the same file."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("ray", "torch", "mlflow", "numpy"):
        try:
            out[f"{pkg}.version"] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextmanager
def store_lock(uri: str):
    """Serialize the one-time steps of a sqlite store (create, migrate, create an experiment)
    across processes: MLflow's alembic migrations race and corrupt a fresh store otherwise."""
    path = _sqlite_path(uri)
    if path is None:
        yield
        return
    from filelock import FileLock

    with FileLock(str(path) + ".lock", timeout=300):
        yield


def check_store(uri: str, timeout_s: float = 10.0) -> None:
    """Fail fast with one line (``ConfigError``) if the tracking store cannot be used.

    sqlite: the folder must be writable; the store is created and migrated once, under a lock.
    http(s): an MLflow server must answer ``/health`` within ``timeout_s``."""
    from orchard.errors import ConfigError

    uri = resolve_uri(uri)
    if uri.startswith(("http://", "https://")):
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
                if reply.status != 200:
                    raise OSError(f"HTTP {reply.status}")
        except Exception as exc:
            raise ConfigError("tracking.uri", f"an MLflow server that answers; none did at {uri} ({_short(exc)}); "
                              "start one (README: team tracking) or use tracking.uri=sqlite:///mlflow.db") from None
        return
    path = _sqlite_path(uri)
    if path is None:
        return
    try:
        config_lib.ensure_writable(path.parent)
    except OSError as exc:
        raise ConfigError("tracking.uri", f"a sqlite file in a writable folder; {path.parent}: {exc.strerror}") from None
    from mlflow.tracking import MlflowClient

    import logging

    # MLflow announces each creation/migration step at INFO: bookkeeping, not news for the console
    for name in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with store_lock(uri):
        MlflowClient(uri).search_experiments(max_results=1)  # creates and migrates the store once


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", None) or exc).splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


def ensure_experiment(client, name: str, artifact_location: str | None) -> str:
    with store_lock(client.tracking_uri):
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        location = None
        if artifact_location:
            location = artifact_location if "://" in artifact_location else Path(artifact_location).resolve().as_uri()
        try:
            return client.create_experiment(name, artifact_location=location)
        except Exception:  # created meanwhile by a process on another machine (server stores)
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def open_run(cfg: dict, run_name: str, parent_run_id: str | None = None, extra_tags: dict | None = None) -> TrackedRun:
    """Create the MLflow run: params = flattened config, tags, and ``config.yaml`` artifact."""
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    tcfg = cfg["tracking"]
    uri = resolve_uri(tcfg["uri"])
    client = MlflowClient(uri)
    experiment = tcfg.get("experiment") or cfg["workload"]["name"]
    exp_id = ensure_experiment(client, experiment, tcfg.get("artifact_location"))
    tags = {
        "mlflow.runName": run_name,
        "orchard.workload": cfg["workload"]["name"],
        "orchard.strategy": cfg["strategy"]["name"],
        "orchard.command": "python -m orchard " + " ".join(cfg.get("_overrides", [])),
        "mlflow.source.git.commit": git_commit(),
        "mlflow.source.name": "orchard",
        **_versions(),
        **driver_tags(),
        **(extra_tags or {}),
    }
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(exp_id, run_name=run_name, tags=tags)
    run_id = run.info.run_id
    plain = {k: v for k, v in cfg.items() if k not in _NOT_PARAMS and not k.startswith("_")}
    params = [Param(k, str(v)[:6000]) for k, v in sorted(config_lib.flatten(plain).items())]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i:i + 100])
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if k != "mlflow.runName"])
    log_config(client, run_id, plain)
    return TrackedRun(run_id, exp_id, uri)


def log_config(client, run_id: str, cfg: dict) -> None:
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        client.log_artifact(run_id, str(path))


def close_run(run: TrackedRun, status: str, error: BaseException | None = None) -> None:
    """End the run with ``status`` (FINISHED | FAILED | KILLED), recording the error if any."""
    client = run.client()
    if error is not None:
        reason = f"{type(error).__name__}: {error}".strip()
        client.set_tag(run.run_id, "orchard.error", reason[:5000])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "error.txt"
            path.write_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))
            client.log_artifact(run.run_id, str(path))
    client.set_terminated(run.run_id, status=status)


def ui_command(uri: str) -> str:
    """The command that opens the MLflow UI on this store (bound to localhost)."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def in_notebook_or_tty() -> bool:
    return sys.stdout.isatty() or "JPY_PARENT_PID" in os.environ
