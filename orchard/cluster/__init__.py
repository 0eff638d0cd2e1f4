"""The Ray session: an embedded local Ray by default, or attach to an existing cluster."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from orchard.cluster import ray_logging, ray_private
from orchard.storage.private_tmp import private_tmp

REPO_ROOT = Path(__file__).resolve().parents[2]
# What a cluster=remote job ships, an allow-list (docs/cluster.md "Security"): these folders of the
# checkout, plus the packages of workloads registered from outside it, and in them only files
# of these kinds. Never the rest of the checkout: a .env, mlflow.db, outputs/, a key file.
SHIPPED_FOLDERS = ("orchard", "workloads", "conf")
SHIPPED_FILES = ("*.py", "*.yaml", "*.yml")


def connect(cluster: dict) -> bool:
    """Start or attach to Ray as ``cluster`` says; returns True if this call started it."""
    import ray

    if ray.is_initialized():  # tests and notebooks start Ray once and reuse it
        return False
    ray_private.set_auto_connect(os.environ.get("RAY_ENABLE_AUTO_CONNECT", "") != "0")  # undo shutdown()
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
        with contextlib.ExitStack() as cleanup:
            where = "foreign"  # a working_dir or py_modules of the user's own: used as given
            if not runtime_env.get("working_dir") and not runtime_env.get("py_modules"):
                folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="ship-", dir=private_tmp()))
                shipped = ship(REPO_ROOT, outside_packages(), Path(folder))
                if client:
                    # Ray Client: ship the packages as py_modules, not a working_dir. The client
                    # server on the head runs with a working_dir copy as its current directory,
                    # and torch's oneMKL aborts the server if that folder is gone when torch is
                    # first imported there (docs/cluster.md); py_modules leave it alone.
                    runtime_env["py_modules"] = [str(p) for p in shipped if p.name != "conf"]
                    where = "modules"
                else:
                    # the workers run in (and import from) the allow-listed copy of the checkout
                    runtime_env["working_dir"] = folder
                    where = "shipped"
            runtime_env = ray_logging.quiet(level, runtime_env, where)
            # ray.init packs and uploads the copy: it may go once init returns
            with _starting_ray():
                info = _init_attached(cluster["address"], runtime_env or None, common, client)
        _print_addresses(cluster["address"], info)
        return True
    prepare_local_env()
    inherited, runtime_env = _as_environment(ray_logging.quiet(level, runtime_env, "local"))
    dashboard = bool(cluster.get("include_dashboard", False))
    if not dashboard:
        os.environ.setdefault(DATA_USAGE_DISABLED, "1")
    with (_ray_in_own_process_group(), _own_address() as pinned, _starting_ray(), _environment(inherited),
          ray_private.without_api_server(skip=not dashboard)):
        ray.init(
            # Ray's session folder (logs, sockets, spilled objects) in this user's private
            # folder: Ray makes its default /tmp/ray writable by every user of the machine
            _temp_dir=str(private_tmp() / "ray"),
            # "local": always a new embedded Ray. Without it ray.init() attaches to whatever cluster
            # /tmp/ray/ray_current_cluster names (another run's, a test's), and fails or shares it.
            address="local",
            num_cpus=cluster.get("num_cpus"),
            num_gpus=cluster.get("num_gpus"),
            object_store_memory=cluster.get("object_store_memory"),
            include_dashboard=dashboard,
            dashboard_host=cluster.get("dashboard_host", "127.0.0.1"),
            runtime_env=runtime_env or None,
            _system_config=idle_worker_config(),
            **common,
        )
        pinned(ray.get_runtime_context().gcs_address)
    _private_token()
    return True


def _as_environment(runtime_env: dict) -> tuple[dict[str, str], dict]:
    """(variables for an embedded Ray to inherit, the runtime_env still to pass to ``ray.init``).

    An embedded Ray's processes inherit this process's environment when ``ray.init`` starts
    them, so orchard's own runtime_env (environment variables and the log-quieting setup hook)
    can travel that way; a job runtime_env would cost the run its prestarted workers
    (``ray_private.setup_hook_environment``). A user's runtime_env with anything else in it
    (pip, a working_dir, a hook given as a function) is passed as it is, with orchard's parts."""
    hook = runtime_env.get("worker_process_setup_hook")
    if set(runtime_env) - {"env_vars", "worker_process_setup_hook"} or not isinstance(hook, (str, type(None))):
        return {}, runtime_env
    inherited = {k: str(v) for k, v in (runtime_env.get("env_vars") or {}).items()}
    if hook:
        inherited.update(ray_private.setup_hook_environment(hook))
    return inherited, {}


@contextlib.contextmanager
def _environment(variables: dict[str, str]):
    """``variables`` in this process's environment while Ray starts (its processes copy them),
    as they were afterwards: the driver and what it starts later keep their own."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            _restore(key, value)


def _private_token() -> None:
    """Ray writes its auth token world-readable (0644); whoever reads it can run code on the
    cluster: only its owner may."""
    token = Path.home() / ".ray" / "auth_token"
    try:
        if token.is_file() and token.stat().st_uid == os.getuid() and token.stat().st_mode & 0o077:
            token.chmod(0o600)
    except OSError:
        pass


IDLE_WORKER_KILLING = "idle_worker_killing_time_threshold_ms"
# How long the embedded Ray keeps an idle worker process that it could kill. Ray's default is 1 s,
# and while actors hold CPUs (the forest's histogram actors, a pipeline's stages) it does kill idle
# task workers (measured: both of two, a few seconds after their tasks, beside actors holding 1.5
# of 2 CPUs; tests/orchard/cluster/test_cluster.py). A forest round's tasks pause longer than that
# between their rounds (phases 3 and 4), so the workers that ran them were killed and their
# successors paid a process start and numba's kernel loads again: with 16 workers, 224 phase-2
# tasks ran in 37 processes, and in 16 with the processes kept (training 59.4 s -> 37.1 s; mid
# shape, Ray told 16 CPUs on 2 cores, 2026-12-04: docs/scaling.md). An idle process holds memory,
# no CPU; a minute frees what a finished run leaves.
IDLE_WORKER_KEEP_MS = 60_000


def idle_worker_config() -> dict:
    """The embedded Ray's ``_system_config``: idle workers kept ``IDLE_WORKER_KEEP_MS``, unless
    the user set Ray's own variable (``RAY_idle_worker_killing_time_threshold_ms``), which wins.
    A cluster's operator sets that variable on ``ray start`` (docs/cluster.md)."""
    if f"RAY_{IDLE_WORKER_KILLING}" in os.environ:
        return {}
    return {IDLE_WORKER_KILLING: IDLE_WORKER_KEEP_MS}


PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
HEALTH_CHECK_INTERVAL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
# Ray Data records each execution's plan for Ray's usage report in an actor of its own, started by
# the first dataset a Ray runs (its process start ~1-2 CPU-s of a 2-core machine, in every embedded
# Ray a video run starts), read by the dashboard's usage reporter alone. An embedded Ray without its
# dashboard has no reporter, so the driver (where Ray Data's executor decides) skips the record; a
# user's own setting wins, and a cluster's Ray keeps its own (the actor outlives the run there)
DATA_USAGE_DISABLED = "RAY_DATA_USAGE_DISABLED"
# Ray Train's controller polls its workers every 2 s by default, and each of its state changes at
# the end of a run (finished, shutting down, done) waits for a poll: 3.5-4.5 s between a flower
# smoke run's last step and fit() returning, on every Train run (measured: the ``training`` part
# of the time split, 5.1 s at 2 s, 1.6 s at 0.5 s, 0.7 s at 0.2 s). A poll is one small actor call
# per worker; one that does not answer in time is awaited at the next, and only one hanging for
# RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S (10 min) fails a worker, so a short interval costs no
# false failures. Elastic groups too: at 0.2 s a restart after a lost node came within the elastic
# policy's 1 s cache of the nodes, which still held the lost one, and its placement group waited
# for a CPU that was gone; ray_private.lean_trainer has the restart read the nodes anew.
HEALTH_CHECK_INTERVAL_S = 0.2


def worker_env(cluster: dict) -> dict:
    """Environment variables every process of the run's Ray job gets (the job's runtime_env),
    read by Ray Train's controller wherever it runs: the bound on a worker group's start
    (``cluster.worker_start_timeout_s``), and on an embedded Ray no preemption watcher. That is
    an actor per worker group polling the GCS for nodes a cloud provider drains (spot
    preemption); an embedded Ray is one machine no provider drains, and the actor only took CPU
    from the workers (0.2-0.9 CPU s at the start of a 2-worker flower run on 2 cores:
    ``python -m bench flower_profile``). Its poll of the workers every 0.2 s rather than 2 s
    (``HEALTH_CHECK_INTERVAL_S``). A user's own setting of a variable wins."""
    bound = cluster.get("worker_start_timeout_s")
    env = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(float(bound))} if bound else {}
    if HEALTH_CHECK_INTERVAL not in os.environ:
        env[HEALTH_CHECK_INTERVAL] = str(HEALTH_CHECK_INTERVAL_S)
    if cluster.get("mode") == "local" and PREEMPTION_WATCHER not in os.environ:
        env[PREEMPTION_WATCHER] = "0"
    return env


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

    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_GCS_SERVER_PORT")}
    with socket.socket() as probe:  # a free port now; Ray binds it a moment later
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)
    os.environ["RAY_ADDRESS"] = f"{ray_private.node_ip_address()}:{port}"
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
def _starting_ray():
    """While ``ray.init`` runs: Ctrl-C and SIGTERM are held and raised as orchard's ``Interrupted``
    once it returns (exit 130 / 143, no run opened), and Ray does not put its own SIGTERM handler
    in place of orchard's (``ray_private.driver_keeps_its_sigterm_handler``). Raised in the middle
    of Ray's start-up, a signal was lost there or ended the process with status 15."""
    from orchard.terminal import interrupts

    with ray_private.driver_keeps_its_sigterm_handler(), interrupts.deferred(reraise=True):
        yield


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
    with ray_private.ray_children_in_their_own_group():
        yield


# Ray Client's proxy forks a server for each client that connects, and that server sometimes dies
# in the fork (gRPC's poller, ray-project/ray#63202: ~7% of connects there; one CI run met it here,
# 2026-12-06), which the client reads as "Initialization failure from server". A new connect
# forks a new server: one more try, said on the console.
CLIENT_CONNECT_TRIES = 2


def _init_attached(address: str, runtime_env, common: dict, client: bool):
    """``ray.init`` attached to ``address``; a Ray Client connect whose server died starting
    (above) is tried again, once."""
    import ray

    tries = CLIENT_CONNECT_TRIES if client else 1
    for attempt in range(1, tries + 1):
        try:
            return ray.init(address=address, runtime_env=runtime_env, **common)
        except ConnectionAbortedError as exc:
            if attempt == tries or "Initialization failure from server" not in str(exc):
                raise
            print(f"orchard: Ray Client's server at {address} failed to start (ray-project/ray#63202); "
                  "connecting again", file=sys.stderr, flush=True)


def _print_addresses(address: str, info) -> None:
    """Where the attached cluster is and where its dashboard answers (docs/cluster.md)."""
    import sys

    url = getattr(info, "dashboard_url", None) or ""
    if url and "://" not in url:
        url = f"http://{url}"
    print(f"orchard: attached to Ray cluster {address}; dashboard {url or 'off'}", file=sys.stderr, flush=True)


def numba_cache_dir() -> Path:
    """orchard's folder for numba's compiled kernels: ``$XDG_CACHE_HOME/orchard/numba``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchard" / "numba"


def prepare_local_env() -> None:
    """Local workers inherit this environment: let them import what the driver imports
    (workloads/, and test workloads when the driver is pytest), and keep their caches out of
    the source tree and away from other users: the node cache in this user's private folder,
    numba's compiled kernels (forest) in ``$XDG_CACHE_HOME/orchard/numba``, not beside the
    sources in ``__pycache__``. A value already in the environment wins."""
    paths = [str(REPO_ROOT), os.getcwd()] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    os.environ.setdefault("ORCHARD_NODE_CACHE", str(private_tmp() / "node-cache"))
    os.environ.setdefault("NUMBA_CACHE_DIR", str(numba_cache_dir()))
    numba = sys.modules.get("numba")
    if numba is not None and not getattr(numba.config, "CACHE_DIR", ""):  # imported before: tell it too
        numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]


def outside_packages() -> list[Path]:
    """The top-level packages of workloads registered from outside this checkout (their
    workers import them): a registered module's package folder, if it is one."""
    import importlib.util

    from orchard.config import registry

    found = []
    for module in registry.module_names():
        top = module.split(".", 1)[0]
        if top in SHIPPED_FOLDERS:
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            if Path(location).is_dir() and Path(location) not in found:
                found.append(Path(location))
    return found


def ship(root: Path, packages: list[Path], dest: Path) -> list[Path]:
    """Copy what a remote job ships into ``dest``: ``SHIPPED_FOLDERS`` of ``root`` and
    ``packages``, only files matching ``SHIPPED_FILES``; returns the copied top folders."""
    import fnmatch

    def not_shipped(folder: str, names: list[str]) -> set[str]:
        def is_code(n: str) -> bool:
            return os.path.isdir(os.path.join(folder, n)) or any(fnmatch.fnmatch(n, p) for p in SHIPPED_FILES)
        return {n for n in names if n.startswith(".") or n == "__pycache__" or not is_code(n)}

    copied = []
    for source in [root / name for name in SHIPPED_FOLDERS] + list(packages):
        if source.is_dir() and not (dest / source.name).exists():
            shutil.copytree(source, dest / source.name, ignore=not_shipped, symlinks=False)
            copied.append(dest / source.name)
    return copied


def shutdown() -> None:
    """Stop the Ray that ``connect`` started, and keep it stopped.

    Ray Data iterators left unfinished (a run stopped mid-epoch) shut their executor down when
    they are garbage-collected, and that calls Ray, which would start a *new* Ray in this
    process (Ray's auto-init) and hang its exit: collect them while Ray is up, then turn
    auto-init off."""
    import gc

    import ray

    gc.collect()
    ray_private.stop_autoscaler_monitor()
    ray.shutdown()
    ray_private.set_auto_connect(False)
    while _PINNED:  # the Ray that RAY_ADDRESS named is gone
        _restore("RAY_ADDRESS", _PINNED.pop())
