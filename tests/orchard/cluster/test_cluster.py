"""cluster=remote attaches to an existing Ray cluster with no other change: a separate driver
process attaches to the test session's running cluster, ships this checkout as its working
dir, runs a workload there, and leaves the cluster running."""
import subprocess

import pytest

from tests.tiny_workload.cli import tiny_cli, tiny_cli_env


@pytest.mark.slow
def test_remote_mode_attaches_to_a_running_cluster(ray_session, tmp_path):
    from mlflow.tracking import MlflowClient

    address = ray_session.get_runtime_context().gcs_address
    nodes_before = len(ray_session.nodes())
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.run(tiny_cli("workload=tiny", "cluster=remote", f"cluster.address={address}",
                           "tiny.steps=5", f"tracking.uri={uri}", f"output_dir={tmp_path}/out"),
                          cwd=tmp_path, env=tiny_cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["cluster.mode"] == "remote"
    assert len(client.get_metric_history(runs[0].info.run_id, "worker/loss")) == 5  # ran in the cluster's workers
    # the attached driver left the cluster as it found it
    assert ray_session.is_initialized() and len(ray_session.nodes()) == nodes_before
    assert ray_session.get(ray_session.remote(lambda: 42).remote()) == 42


PINNED = r"""
import json, logging, os, sys
import ray
from orchard import cluster
from orchard.cluster import ray_logging, ray_private

cluster.connect({"mode": "local", "num_cpus": 1, "worker_start_timeout_s": 77})
own = ray.get_runtime_context().gcs_address
hook_var = next(iter(ray_private.setup_hook_environment("x")))

@ray.remote(num_cpus=0)
def lookup():
    # how Ray Train's PlacementGroupCleaner (the state API) finds the cluster from its worker:
    # by "auto", which fails with "Found multiple active Ray instances" unless RAY_ADDRESS names one
    from ray._private import services
    return {"auto": services.canonicalize_bootstrap_address("auto"),
            "timeout": os.environ.get("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"),
            "preemption_watcher": os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"),
            "health_check_s": os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"),
            # the setup hook ran as the worker started: Ray's token notice is filtered here too
            "hooked": bool(logging.getLogger(ray_logging.TOKEN_SETUP).filters),
            "job_env": ray.get_runtime_context().runtime_env,
            "state_api": state_api()}

def state_api():
    # as Ray Train's placement-group cleaner asks: "unavailable" is the error it handles
    from ray.util.state import get_actor
    from ray.util.state.exception import RayStateApiException
    try:
        get_actor("00" * 16, timeout=5)
        return "answered"
    except RayStateApiException:
        return "unavailable"
    except Exception as exc:
        return type(exc).__name__

seen = ray.get(lookup.remote())
driver = os.environ.get("RAY_ADDRESS")
driver_env = [k for k in (hook_var, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S") if k in os.environ]
from ray._private import ray_constants, worker
api_server = ray_constants.PROCESS_TYPE_DASHBOARD in worker._global_node.all_processes
monitor_stopped = ray_private.stop_autoscaler_monitor()
cluster.shutdown()
print(json.dumps({"own": own, "worker": seen, "driver": driver, "after": os.environ.get("RAY_ADDRESS"),
                  "port_var": os.environ.get("RAY_GCS_SERVER_PORT"), "driver_env": driver_env,
                  "monitor_stopped": monitor_stopped, "api_server": api_server,
                  "data_usage_disabled": os.environ.get("RAY_DATA_USAGE_DISABLED")}))
"""


@pytest.mark.slow
def test_an_embedded_ray_is_found_by_its_own_address_beside_other_ray_instances(ray_session, tmp_path):
    """Another Ray instance runs on the machine (this test session's): inside orchard's embedded
    Ray, a lookup by ``"auto"`` (Ray Train's placement-group cleaner, the state API) must find
    orchard's own Ray, not fail with "Found multiple active Ray instances"."""
    import json
    import os
    import sys

    from tests.tiny_workload.cli import tiny_cli_env

    env = {k: v for k, v in tiny_cli_env().items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", PINNED], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["own"] != ray_session.get_runtime_context().gcs_address  # two instances on this machine
    assert seen["worker"]["auto"] == seen["own"] and seen["driver"] == seen["own"]
    assert seen["worker"]["timeout"] == "77.0"  # cluster.worker_start_timeout_s reaches Train's controller
    # one machine that no cloud provider drains: no preemption watcher beside the workers
    assert seen["worker"]["preemption_watcher"] == "0"
    # Train's controller sees a run's end within 0.2 s, not after several 2 s polls
    assert seen["worker"]["health_check_s"] == "0.2"
    # all of it inherited, none of it a job runtime_env (which costs a run Ray's prestarted
    # workers), and the driver's own environment as it was
    assert seen["worker"]["hooked"] and not seen["worker"]["job_env"] and seen["driver_env"] == []
    # the autoscaler monitor that Ray's shutdown waits a second for is found and stopped first
    assert seen["monitor_stopped"]
    # no API-server process to wait for at the start (include_dashboard=false), and the state
    # API's clients get the answer they handle, as when it ran without its state module
    assert not seen["api_server"] and seen["worker"]["state_api"] == "unavailable"
    # and without the dashboard no usage report: Ray Data keeps no usage record (no actor for it)
    assert seen["data_usage_disabled"] == "1"
    assert seen["after"] is None and seen["port_var"] is None  # nothing left pointing at a stopped Ray
    assert os.environ.get("RAY_GCS_SERVER_PORT") is None


def test_a_remote_job_ships_an_allow_list_of_the_checkout_not_its_secrets(tmp_path):
    """cluster=remote ships orchard/, workloads/, conf/ and outside workloads' packages, code and
    configs only: a .env, the MLflow store, run outputs and key files stay on the driver."""
    from orchard.cluster import ship

    root, mine = tmp_path / "checkout", tmp_path / "elsewhere" / "mypkg"
    files = ["orchard/cli/__init__.py", "orchard/.env", "orchard/__pycache__/cli.cpython-311.pyc", "workloads/a/run.py",
             "workloads/a/id_rsa", "conf/config.yaml", ".env", "mlflow.db", "mlflow.db.lock", "outputs/run/log.txt",
             "notes/secret.key"]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    (mine / "conf").mkdir(parents=True)
    (mine / "__init__.py").write_text("")
    (mine / "conf" / "tiny.yaml").write_text("")
    (mine / "token.json").write_text("{}")
    dest = tmp_path / "ship"
    dest.mkdir()
    ship(root, [mine], dest)
    shipped = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert shipped == ["conf/config.yaml", "mypkg/__init__.py", "mypkg/conf/tiny.yaml", "orchard/cli/__init__.py",
                       "workloads/a/run.py"]


def test_embedded_ray_and_local_caches_live_in_a_private_folder_of_the_user(tmp_path, monkeypatch):
    """Ray's session folder and the node cache go to <tmp>/orchard-<uid> (0700), numba's cache
    to the user's cache folder: not to a folder every user of the machine can write."""
    import os

    from orchard import cluster
    from orchard.storage.private_tmp import private_tmp

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    for var in ("ORCHARD_NODE_CACHE", "NUMBA_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    own = private_tmp()
    assert own == tmp_path / f"orchard-{os.getuid()}" and own.stat().st_mode & 0o777 == 0o700
    own.chmod(0o777)  # loosened by someone: tightened again before use
    assert private_tmp().stat().st_mode & 0o777 == 0o700
    cluster.prepare_local_env()
    assert os.environ["ORCHARD_NODE_CACHE"] == str(own / "node-cache")
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "cache" / "orchard" / "numba")


def test_ray_train_polls_its_workers_every_0_2_s_unless_the_user_says_otherwise(monkeypatch):
    """0.2 s polls for every group, elastic ones too; a user's own setting is never replaced."""
    from orchard import cluster

    monkeypatch.delenv(cluster.HEALTH_CHECK_INTERVAL, raising=False)
    assert cluster.worker_env({"mode": "local"})[cluster.HEALTH_CHECK_INTERVAL] == "0.2"
    monkeypatch.setenv(cluster.HEALTH_CHECK_INTERVAL, "1.5")
    assert cluster.HEALTH_CHECK_INTERVAL not in cluster.worker_env({"mode": "remote"})


def test_an_embedded_rays_workers_inherit_orchards_runtime_env_and_a_users_own_is_passed_whole():
    """orchard's own runtime_env (variables, the quieting hook) becomes the environment an
    embedded Ray inherits, so its prestarted workers serve the run; a user's runtime_env with
    more in it (pip, a working_dir) goes to ``ray.init`` whole, orchard's parts included."""
    from orchard import cluster
    from orchard.cluster import ray_private

    ours = {"env_vars": {"A": "1", "B": 2}, "worker_process_setup_hook": "orchard.cluster.ray_logging.install_filters"}
    inherited, passed = cluster._as_environment(ours)
    assert passed == {} and inherited == {"A": "1", "B": "2", **ray_private.setup_hook_environment(
        "orchard.cluster.ray_logging.install_filters")}
    theirs = {**ours, "pip": ["requests"]}
    assert cluster._as_environment(theirs) == ({}, theirs)
    as_function = {"worker_process_setup_hook": print}  # Ray exports a function through its store
    assert cluster._as_environment(as_function) == ({}, as_function)


@pytest.mark.slow
def test_an_embedded_ray_keeps_an_idle_task_worker_while_actors_hold_its_cpus(ray_session):
    """The Ray a run embeds (the session's is started the same way) keeps an idle worker process
    past Ray's default second: actors hold most CPUs, as a forest round's histogram actors do while
    the round's tasks wait for phases 3 and 4, and the next round's tasks find their processes
    (and their loaded kernels) still there. Ray's default killed both of these workers."""
    import os
    import time

    import psutil

    ray = ray_session

    @ray.remote(num_cpus=0.5)
    class Holder:
        def ping(self) -> bool:
            return True

    @ray.remote(num_cpus=0.25)
    def pid() -> int:
        time.sleep(0.5)  # two at once: two worker processes
        return os.getpid()

    holders = [Holder.remote() for _ in range(3)]  # 1.5 of the session's 2 CPUs
    try:
        ray.get([h.ping.remote() for h in holders])
        workers = ray.get([pid.remote() for _ in range(2)])
        time.sleep(3)
        alive = [psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers]
    finally:
        for h in holders:
            ray.kill(h)
    assert alive == [True, True]


def test_the_embedded_rays_idle_workers_are_kept_a_minute_unless_the_user_says_otherwise(monkeypatch):
    from orchard import cluster

    monkeypatch.delenv("RAY_idle_worker_killing_time_threshold_ms", raising=False)
    assert cluster.idle_worker_config() == {"idle_worker_killing_time_threshold_ms": 60_000}
    monkeypatch.setenv("RAY_idle_worker_killing_time_threshold_ms", "5000")
    assert cluster.idle_worker_config() == {}
