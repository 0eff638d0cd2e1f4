"""The Ray session: an embedded local Ray by default, or attach to an existing cluster."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RAY_DATA_LOGGING = Path(__file__).resolve().parent / "ray_data_logging.yaml"
LIBRARY_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def quiet_libraries(level: str) -> dict[str, str]:
    """Environment that keeps Ray Train's and Ray Data's own INFO chatter (worker-group
    start, every report, every dataset execution) off the console at ``level`` WARNING or
    above; it still goes to the session's log files.  Set in this process before Ray starts
    (local workers inherit it) and returned for a remote cluster's runtime_env."""
    level = level.upper()
    env = {"ORCHARD_RAY_LOG_LEVEL": level}
    if LIBRARY_LOG_LEVELS.index(level) >= LIBRARY_LOG_LEVELS.index("WARNING"):
        env["RAY_DATA_LOGGING_CONFIG"] = str(RAY_DATA_LOGGING)
        # Ray Train 2.60's worker-side logging ignores RunConfig's LoggingConfig: without its
        # own config the workers' ray.train records follow ray.init's logging_config instead.
        env["RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING"] = "0"
    for key, value in env.items():
        os.environ.setdefault(key, value)
    if "RAY_DATA_LOGGING_CONFIG" in env and "ray.data" in sys.modules:
        # ray.data configured its logger when it was imported: apply ours now.
        with contextlib.suppress(Exception):
            from ray.data._internal.logging import configure_logging

            configure_logging()
    return env


def connect(cluster: dict) -> bool:
    """Start or attach to Ray as ``cluster`` says; returns True if this call started it."""
    import ray

    if ray.is_initialized():  # tests and notebooks start Ray once and reuse it
        return False
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Ray Train V2 prints deprecation notices for APIs orchard does not use.
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    runtime_env = dict(cluster.get("runtime_env") or {})
    quiet = quiet_libraries(cluster.get("ray_log_level", "WARNING"))
    common = dict(logging_level=logging.WARNING, log_to_driver=cluster.get("log_to_driver", True),
                  logging_config=ray.LoggingConfig(log_level=quiet["ORCHARD_RAY_LOG_LEVEL"]))
    if cluster["mode"] == "remote":
        if not runtime_env.get("working_dir"):
            # Ship this checkout so the cluster's workers import the same orchard and workloads.
            runtime_env["working_dir"] = str(REPO_ROOT)
            # Only code and configs travel: virtualenvs, run outputs and data stay behind
            # (Ray refuses a working_dir over a few hundred MB).
            runtime_env.setdefault("excludes", [".git", ".venv*", "venv", "build", "outputs", "mlruns", "mlartifacts",
                                                "*.db", "multirun", "*.mp4", "*.png", "*.npz", "*.pt"])
            if "RAY_DATA_LOGGING_CONFIG" in quiet:  # the workers' working dir is the shipped checkout
                quiet["RAY_DATA_LOGGING_CONFIG"] = "orchard/ray_data_logging.yaml"
        if runtime_env["working_dir"] != str(REPO_ROOT):
            quiet.pop("RAY_DATA_LOGGING_CONFIG", None)  # a user's working dir may not hold our file
        runtime_env["env_vars"] = {**quiet, **(runtime_env.get("env_vars") or {})}
        ray.init(address=cluster["address"], runtime_env=runtime_env or None, **common)
        return True
    prepare_local_env()
    ray.init(
        num_cpus=cluster.get("num_cpus"),
        num_gpus=cluster.get("num_gpus"),
        object_store_memory=cluster.get("object_store_memory"),
        include_dashboard=bool(cluster.get("include_dashboard", False)),
        dashboard_host=cluster.get("dashboard_host", "127.0.0.1"),
        runtime_env=runtime_env or None,
        **common,
    )
    return True


def prepare_local_env() -> None:
    """Local workers inherit this environment: let them import what the driver imports
    (workloads/, and test workloads when the driver is pytest)."""
    paths = [str(REPO_ROOT), os.getcwd()] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))


def shutdown() -> None:
    import ray

    ray.shutdown()
