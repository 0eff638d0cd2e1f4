"""The Ray session: an embedded local Ray by default, or attach to an existing cluster."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from orchard import ray_logging

REPO_ROOT = Path(__file__).resolve().parent.parent
# what a Ray Client job ships as py_modules (connect): the packages its workers import
SHIPPED_MODULES = [str(REPO_ROOT / "orchard"), str(REPO_ROOT / "workloads")]
LIBRARY_LOG_LEVELS = ray_logging.LEVELS


def connect(cluster: dict) -> bool:
    """Start or attach to Ray as ``cluster`` says; returns True if this call started it."""
    import ray

    if ray.is_initialized():  # tests and notebooks start Ray once and reuse it
        return False
    from ray._private import auto_init_hook

    auto_init_hook.enable_auto_connect = os.environ.get("RAY_ENABLE_AUTO_CONNECT", "") != "0"  # undo shutdown()
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Ray Train V2 prints deprecation notices for APIs orchard does not use.
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    runtime_env = dict(cluster.get("runtime_env") or {})
    if worker_env(cluster):
        runtime_env["env_vars"] = {**worker_env(cluster), **(runtime_env.get("env_vars") or {})}
    level = cluster.get("ray_log_level", "WARNING")
    common = dict(logging_level=logging.WARNING, log_to_driver=cluster.get("log_to_driver", True))
    if cluster["mode"] == "remote":
        client = str(cluster["address"]).startswith("ray://")
        if not runtime_env.get("working_dir") and not runtime_env.get("py_modules"):
            if client:
                # Ray Client: ship the packages as py_modules, not the checkout as working_dir. The
                # client server on the head runs with a working_dir copy as its current directory,
                # and torch's oneMKL aborts the server if that folder is gone when torch is first
                # imported there (docs/cluster.md); py_modules leave its current directory alone.
                runtime_env["py_modules"] = list(SHIPPED_MODULES)
            else:
                # Ship this checkout so the cluster's workers import the same orchard and workloads.
                runtime_env["working_dir"] = str(REPO_ROOT)
            # Only code and configs travel: virtualenvs, run outputs and data stay behind
            # (Ray refuses a working_dir over a few hundred MB).
            runtime_env.setdefault("excludes", [".git", ".venv*", "venv", "build", "outputs", "mlruns", "mlartifacts",
                                                "*.db", "multirun", "*.mp4", "*.png", "*.npz", "*.pt"])
        where = ("shipped" if runtime_env.get("working_dir") == str(REPO_ROOT)
                 else "modules" if runtime_env.get("py_modules") == SHIPPED_MODULES
                 else "foreign")
        runtime_env = ray_logging.quiet(level, runtime_env, where)
        info = ray.init(address=cluster["address"], runtime_env=runtime_env or None, **common)
        _print_addresses(cluster["address"], info)
        return True
    prepare_local_env()
    runtime_env = ray_logging.quiet(level, runtime_env, "local")
    with _ray_in_own_process_group(), _own_address() as pinned:
        ray.init(
            # "local": always a new embedded Ray. Without it ray.init() attaches to whatever cluster
            # /tmp/ray/ray_current_cluster names (another run's, a test's), and fails or shares it.
            address="local",
            num_cpus=cluster.get("num_cpus"),
            num_gpus=cluster.get("num_gpus"),
            object_store_memory=cluster.get("object_store_memory"),
            include_dashboard=bool(cluster.get("include_dashboard", False)),
            dashboard_host=cluster.get("dashboard_host", "127.0.0.1"),
            runtime_env=runtime_env or None,
            **common,
        )
        pinned(ray.get_runtime_context().gcs_address)
    _private_token()
    return True


def _private_token() -> None:
    """Ray writes its auth token world-readable (0644); whoever reads it can run code on the
    cluster: only its owner may."""
    token = Path.home() / ".ray" / "auth_token"
    try:
        if token.is_file() and token.stat().st_uid == os.getuid() and token.stat().st_mode & 0o077:
            token.chmod(0o600)
    except OSError:
        pass


def worker_env(cluster: dict) -> dict:
    """Environment variables every process of the run's Ray job gets (the job's runtime_env):
    the bound on a Ray Train worker group's start (``cluster.worker_start_timeout_s``), read by
    Train's controller wherever it runs."""
    bound = cluster.get("worker_start_timeout_s")
    return {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(float(bound))} if bound else {}


@contextlib.contextmanager
def _own_address():
    """Every process of the embedded Ray resolves "the cluster" to this one, never by ``"auto"``.

    Parts of Ray look the cluster up by ``address="auto"`` from inside its workers: Ray Train's
    detached ``PlacementGroupCleaner`` and the state API it calls. With another Ray instance on the
    machine (another run's, a notebook's) that lookup fails with "Found multiple active Ray
    instances"; the cleaner died, the finished trial's placement group was never freed, and the
    next trial of a sweep waited forever for its CPUs. Ray's lookup reads ``RAY_ADDRESS`` first,
    and its processes inherit the driver's environment when ``ray.init`` starts them: so the GCS
    port is chosen here (``RAY_GCS_SERVER_PORT``, which Ray honours for a new head) and
    ``RAY_ADDRESS`` names it before the raylet forks any worker. Yields ``pinned(address)``, to be
    called with the address Ray reports once up; the port variable is removed again so that a
    Ray started later by this process picks its own."""
    import socket

    from ray._private import services

    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_GCS_SERVER_PORT")}
    with socket.socket() as probe:  # a free port now; Ray binds it a moment later
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)
    os.environ["RAY_ADDRESS"] = f"{services.get_node_ip_address()}:{port}"
    actual: list[str] = []
    try:
        yield actual.append
    finally:
        _restore("RAY_GCS_SERVER_PORT", saved["RAY_GCS_SERVER_PORT"])
        if actual:  # the driver's own later lookups (Train, Tune, the state API) find it too
            os.environ["RAY_ADDRESS"] = actual[0]
            _PINNED.append(saved["RAY_ADDRESS"])
        else:  # Ray did not start: nothing to point at
            _restore("RAY_ADDRESS", saved["RAY_ADDRESS"])


_PINNED: list = []  # RAY_ADDRESS as it was before connect() pinned it; put back by shutdown()


def _restore(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


@contextlib.contextmanager
def _ray_in_own_process_group():
    """Start the embedded Ray's processes (GCS, raylet, and the workers the raylet forks) in
    process groups of their own, not in orchard's.

    ``timeout -s TERM``, ``kill -TERM -<pgid>`` and a shell's job control signal a whole process
    group. Ray's processes block SIGINT but not SIGTERM, so one SIGTERM to orchard's group stopped
    the raylet under the driver while orchard was closing the run: 20 s of Ray timeouts, and Ray's
    core worker could end the process with status 1 instead of 143. Out of the group, only the
    driver gets the signal; it closes the run and stops Ray itself. Nothing is left behind if the
    driver dies: Ray starts them with the kernel's parent-death signal (``fate_share``), which is
    also when Ray itself puts its children in a new group (on Windows, ``ConsolePopen``)."""
    from ray._private import services, utils

    if not sys.platform.startswith("linux") or not utils.detect_fate_sharing_support():
        yield
        return
    popen = services.ConsolePopen

    class OwnGroupPopen(popen):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnGroupPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


def _print_addresses(address: str, info) -> None:
    """Where the attached cluster is and where its dashboard answers (docs/cluster.md)."""
    import sys

    url = getattr(info, "dashboard_url", None) or ""
    if url and "://" not in url:
        url = f"http://{url}"
    print(f"orchard: attached to Ray cluster {address}; dashboard {url or 'off'}", file=sys.stderr, flush=True)


def prepare_local_env() -> None:
    """Local workers inherit this environment: let them import what the driver imports
    (workloads/, and test workloads when the driver is pytest)."""
    paths = [str(REPO_ROOT), os.getcwd()] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))


def shutdown() -> None:
    """Stop the Ray that ``connect`` started, and keep it stopped.

    Ray Data iterators left unfinished (a run stopped mid-epoch) shut their executor down when
    they are garbage-collected, and that calls Ray, which would start a *new* Ray in this
    process (Ray's auto-init) and hang its exit: collect them while Ray is up, then turn
    auto-init off."""
    import gc

    import ray
    from ray._private import auto_init_hook

    gc.collect()
    ray.shutdown()
    auto_init_hook.enable_auto_connect = False
    while _PINNED:  # the Ray that RAY_ADDRESS named is gone
        _restore("RAY_ADDRESS", _PINNED.pop())
