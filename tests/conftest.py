"""Shared fixtures: Ray starts once per test session; configs come from ``hydra.compose``;
runs go to a real MLflow sqlite store in a temp folder and are read back with MlflowClient."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchard import register_workload
from tests.session_ray import attach_overrides

TESTS = Path(__file__).resolve().parent
# Every Ray the suite starts (the session's, the test clusters', the embedded Rays of its
# subprocesses: they inherit this environment) looks for new worker log files every 0.5 s, not
# every 0.1 s: Ray's log monitor globs its session's logs folder on each pass until it holds 1,000
# files, 6 ms a pass once a session has ~900 (the suite's does), so 6% of a core all suite long in
# the session's monitor alone (2 min of CPU in its first 38 min). Lines are still forwarded: a
# worker's file is found within 0.5 s and read from its start.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
# The core's test workload: proves an outside package can register a workload and its config.
register_workload("tiny", "tests.tiny_workload", str(TESTS / "tiny_workload" / "conf"))


# What a run writes where it was given nothing else: MLflow's artifacts and stores, orchard's
# output folder (conf/tracking/mlflow.yaml, conf/config.yaml), all relative to the current folder.
RUN_DEFAULTS = ("mlartifacts", "mlruns", "mlflow.db", "outputs", "multirun")


def _left_in_checkout() -> set[str]:
    """What the run defaults hold in the checkout, two levels deep (``mlruns/<experiment>/<run>``,
    ``mlartifacts/models/<model>``, ``outputs/<workload>/<run>``)."""
    found = set()
    for name in RUN_DEFAULTS:
        path = TESTS.parent / name
        if not path.is_dir():
            if path.exists():
                found.add(name)
            continue
        for entry in os.scandir(path):
            found.add(f"{name}/{entry.name}")
            if entry.is_dir():
                found.update(f"{name}/{entry.name}/{inner}" for inner in os.listdir(entry.path))
    return found


@pytest.fixture(autouse=True)
def leaves_nothing_in_the_checkout():
    """A test's runs write into its own folders, never the checkout (pytest runs from it): a run
    given no ``tracking.artifact_location``, ``output_dir`` or working folder of its own fills
    the checkout's ``mlartifacts/``, ``mlruns/`` or ``outputs/`` and is found by the next run there."""
    before = _left_in_checkout()
    yield
    new = sorted(_left_in_checkout() - before)
    assert not new, (f"this test wrote into the checkout: {', '.join(new[:5])}: give its runs a folder of "
                     "their own (tracking.artifact_location, output_dir, cwd=tmp_path)")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (2 CPUs, like CI), started the way a run starts its
    embedded Ray (``orchard.cluster.connect``): the same quieting hooks in every worker (else
    Ray Train's placement-group cleaner, which outlives a Train run, prints into whatever test
    runs next), and its workers find it by its own address."""
    import ray

    from orchard import cluster
    from orchard.config import compose

    local = compose(["workload=tiny"])["cluster"]
    before = os.environ.get("RAY_ADDRESS")
    started = cluster.connect({**local, "num_cpus": 2})
    # connect() points RAY_ADDRESS at this Ray for the driver's own lookups; the tests' child
    # processes (python -m orchard ...) copy os.environ, and a user's shell names no cluster
    if before is None:
        os.environ.pop("RAY_ADDRESS", None)
    yield ray
    if started:
        cluster.shutdown()


@pytest.fixture(scope="session")
def attach(ray_session) -> list[str]:
    """The overrides that attach a ``python -m orchard`` process to the test session's Ray, as a
    user attaches to a cluster (``cluster=remote``, docs/cluster.md): for every subprocess run
    whose test is not about Ray's own start, which then pays no Ray start and stop of its own."""
    return attach_overrides()


@pytest.fixture
def compose():
    """``compose(*overrides) -> dict``: the composed config as a plain dict."""
    from orchard.config import compose as _compose

    return lambda *overrides: _compose(list(overrides))


@pytest.fixture(scope="session")
def tracking_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="session")
def tracking_uri(tracking_dir) -> str:
    """A real MLflow sqlite store, shared by the session's tests (each run has its own id)."""
    return f"sqlite:///{tracking_dir}/mlflow.db"


@dataclass
class RunResult:
    exit_code: int
    run: object            # mlflow.entities.Run (None with tracking=none or a config error)
    metrics: dict          # final metrics as the CLI returned them
    client: object         # MlflowClient on the test store
    outcome: object

    def history(self, key: str) -> list[float]:
        return [m.value for m in self.client.get_metric_history(self.run.info.run_id, key)]

    def artifacts(self, path: str | None = None) -> list[str]:
        return [a.path for a in self.client.list_artifacts(self.run.info.run_id, path)]


@pytest.fixture
def run_orchard(ray_session, tracking_uri, tracking_dir, tmp_path):
    """``run_orchard(*overrides) -> RunResult``: the CLI's path, in process, on the test store."""
    from mlflow.tracking import MlflowClient

    from orchard.run.lifecycle import execute, preflight, prepare

    def _run(*overrides: str) -> RunResult:
        cfg, module = prepare([*overrides, f"tracking.uri={tracking_uri}",
                               f"tracking.artifact_location={tracking_dir}/artifacts",
                               f"output_dir={tmp_path}/outputs"])
        preflight(cfg)
        outcome = execute(cfg, module)
        client = MlflowClient(tracking_uri)
        run = client.get_run(outcome.run_id) if outcome.run_id else None
        return RunResult(outcome.exit_code, run, outcome.metrics, client, outcome)

    return _run


# --------------------------------------------------------------------------- shared CLI smoke runs
@dataclass
class CliRun:
    """One ``python -m orchard ... debug=smoke`` as a user runs it: its console and its MLflow run."""
    args: tuple
    exit_code: int
    console: str           # stdout and stderr together, as the terminal showed them
    run: object            # mlflow.entities.Run
    client: object         # MlflowClient on the session's CLI store
    uri: str

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    @property
    def run_dir(self) -> Path:
        return Path(self.run.data.tags["orchard.run_dir"])

    def artifacts(self, path: str | None = None) -> list[str]:
        return [a.path for a in self.client.list_artifacts(self.run_id, path)]


# Runs that start their own Ray as a user's does: the README's first command, as typed, and the
# elastic decode run, whose pool can only grow into CPUs nobody else holds
# (tests/workloads/video/test_run.py): attached to the session's Ray it would share it with
# whatever the tests before it left there
ELASTIC_DECODE = ("workload=video", "video.decode_concurrency=[1,2]", "video.clips_per_epoch=192",
                  "video.epochs=2", "video.queue_depth=1", "video.widths=[64,128,256]")
EMBEDDED = {("workload=flower", "strategy=ring"), ELASTIC_DECODE}


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory, attach):
    """``cli_run(*overrides) -> CliRun``: a real CLI process, run once per session for each
    distinct set of overrides and shared by every test that asks for the same one (console checks,
    figures, models, predict, notebooks), so CI pays for each smoke run once. All of them write to
    one sqlite store, so notebooks can compare them. Attached to the session's Ray, except the
    README's first command (``EMBEDDED``), which starts its own as a user's does."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("cli_runs")
    uri = f"sqlite:///{root}/mlflow.db"
    done: dict[tuple, CliRun] = {}

    def _run(*overrides: str) -> CliRun:
        key = tuple(overrides)
        if key not in done:
            name = f"cli-{len(done)}"
            cluster = () if key in EMBEDDED else tuple(attach)
            proc = subprocess.run(
                [sys.executable, "-m", "orchard", *overrides, "debug=smoke", f"run_name={name}",
                 f"tracking.uri={uri}", f"output_dir={root}/out", *cluster],
                cwd=root, capture_output=True, text=True, timeout=900,
                env={**os.environ, "PYTHONPATH": str(TESTS.parent), "PYTHONUNBUFFERED": "1"})
            client = MlflowClient(uri)
            exps = [e.experiment_id for e in client.search_experiments()]
            found = client.search_runs(exps, f"tags.mlflow.runName = '{name}'") if exps else []
            assert found, f"no MLflow run for {overrides} (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            done[key] = CliRun(key, proc.returncode, proc.stdout + proc.stderr, found[0], client, uri)
        return done[key]

    return _run


@pytest.fixture(scope="module")
def s3_env():
    """A moto S3 server on 127.0.0.1 with a bucket ``orchard`` (an S3-compatible store on loopback);
    yields the AWS_* variables that point pyarrow at it."""
    import socket
    import subprocess
    import sys
    import time

    pytest.importorskip("moto.server", reason="moto[server] is not installed: no S3-compatible server to test on")
    import pyarrow.fs as pafs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "moto did not start"
                time.sleep(0.2)
        pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="test",
                          secret_key="test", region="us-east-1", allow_bucket_creation=True).create_dir("orchard")
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
