"""A run of the tests' workload lands in MLflow with params, metrics from the driver and from
a Ray task, the config artifact, per-node resource series and their summaries, and a status
that matches what happened.  A store that is locked, read-only or absent (for resume) is found
before anything starts; a write that meets a lock is tried again."""
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.tiny_workload.cli import tiny_cli, tiny_cli_env



def test_finished_run_holds_everything(run_orchard):
    res = run_orchard("workload=tiny", "tiny.steps=30", "tracking.sample_interval_s=0.2")
    assert res.exit_code == 0
    run = res.run
    assert run.info.status == "FINISHED"
    assert run.data.params["tiny.steps"] == "30" and run.data.params["strategy.name"] == "tasks"
    tags = run.data.tags
    assert tags["orchard.workload"] == "tiny" and tags["ray.version"] and tags["torch.version"]
    assert "mlflow.source.git.commit" in tags
    assert tags["orchard.mlflow_version"] and "mlflow.version" not in tags   # mlflow.* is MLflow's own
    # metrics from the driver and from a Ray task, every step
    assert len(res.history("train/loss")) == 30
    assert len(res.history("worker/loss")) == 30
    assert res.history("train/loss")[-1] < res.history("train/loss")[0]
    assert run.data.metrics["train/final_loss"] == pytest.approx(res.metrics["train/final_loss"])
    assert run.data.metrics["time/total_s"] > 0
    # per-node resource series and run-level summaries
    assert len(res.history("system/node0/cpu_pct")) >= 1
    for key in ("system/cpu_pct_mean", "system/cpu_pct_std", "system/node0/mem_pct_mean"):
        assert key in run.data.metrics
    arts = res.artifacts()
    assert "config.yaml" in arts and "figures" in arts and "notes" in arts
    assert res.artifacts("figures") == ["figures/loss.png"]
    cfg_text = Path(res.client.download_artifacts(run.info.run_id, "config.yaml")).read_text()
    assert "tiny:" in cfg_text and "steps: 30" in cfg_text


def test_final_metrics_land_at_the_last_step_not_back_at_zero(run_orchard):
    res = run_orchard("workload=tiny", "tiny.steps=12", "tracking.sample_interval_s=0.2")
    (final,) = res.client.get_metric_history(res.run.info.run_id, "train/final_loss")
    (total,) = res.client.get_metric_history(res.run.info.run_id, "time/total_s")
    assert final.step == total.step == 11  # the run's last training step, whatever the samplers counted
    # a key whose per-step series already ends on the final value is not logged once more
    assert len(res.history("train/loss")) == 12


def test_failing_workload_leaves_a_failed_run_with_the_reason(run_orchard, capsys):
    res = run_orchard("workload=tiny", "tiny.fail=true")
    assert res.exit_code == 1
    assert res.run.info.status == "FAILED"
    assert "asked to fail" in res.run.data.tags["orchard.error"]
    assert "error.txt" in res.artifacts()
    assert "tiny failed: RuntimeError" in capsys.readouterr().err


def test_bad_data_found_inside_the_run_is_exit_2_with_the_run_failed(run_orchard, capsys):
    res = run_orchard("workload=tiny", "tiny.bad_data=true")
    assert res.exit_code == 2 and res.run.info.status == "FAILED"
    assert "usable sample" in res.run.data.tags["orchard.error"]
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("orchard:")]
    assert err == [f"orchard: bad config: tiny.data_dir: a folder with at least one usable sample; none was "
                   f"(tiny.bad_data=true) (run {res.run.info.run_id} marked FAILED)"]


def test_tracking_none_records_nothing_but_returns_metrics(run_orchard):
    res = run_orchard("workload=tiny", "tracking=none", "tiny.steps=5")
    assert res.exit_code == 0 and res.run is None
    assert "train/final_loss" in res.metrics


@pytest.mark.slow
def test_ctrl_c_marks_the_run_killed(tmp_path):
    """A real SIGINT to a real CLI process: exit 130 and a KILLED run."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.Popen(tiny_cli("workload=tiny", "tiny.steps=400", "tiny.sleep_s=0.05",
                             f"tracking.uri={uri}", f"output_dir={tmp_path}/out", "cluster.num_cpus=2"),
                            cwd=tmp_path, env=tiny_cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = MlflowClient(uri)
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until the run is really training
        time.sleep(1)
        try:
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        except Exception:
            continue
        if runs and client.get_metric_history(runs[0].info.run_id, "train/loss"):
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    run = client.get_run(runs[0].info.run_id)
    assert run.info.status == "KILLED"


@pytest.mark.slow
def test_hydra_multirun_runs_each_grid_point(ray_session, tracking_uri, tracking_dir, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from orchard.multirun import run_multirun

    monkeypatch.chdir(tmp_path)
    code = run_multirun(["workload=tiny", "tiny.steps=7,9", "tracking.system_metrics=false",
                         f"tracking.uri={tracking_uri}", f"output_dir={tmp_path}/out", "run_name=multirun-test"])
    assert code == 0
    client = MlflowClient(tracking_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "attributes.run_name = 'multirun-test'")
    assert sorted(r.data.params["tiny.steps"] for r in runs) == ["7", "9"]
    assert all(r.info.status == "FINISHED" for r in runs)
    # one layout for single runs and multirun jobs: <output_dir>/<workload>/<run id>/.hydra/, nothing in the cwd
    assert not (tmp_path / "multirun").exists() and not list(tmp_path.glob("*.log"))
    for run in runs:
        folder = tmp_path / "out" / "tiny" / run.info.run_id
        assert run.data.tags["orchard.run_dir"] == str(folder)
        assert sorted(p.name for p in (folder / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
        hydra = yaml.safe_load((folder / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert hydra["mode"] == "MULTIRUN" and hydra["runtime"]["output_dir"] == str(folder)
        assert f"tiny.steps={run.data.params['tiny.steps']}" in hydra["overrides"]["task"]


@pytest.mark.slow
def test_metrics_sink_killed_mid_run_is_restarted_and_the_run_finishes(run_orchard):
    """The sink dies twice while flower's Train workers log through it: Ray restarts it, the calls
    in flight are resent, and the run ends FINISHED with its metrics (the unflushed batch, at
    most tracking.flush_interval_s of metrics, may be lost)."""
    import threading

    import ray

    kills: list[int] = []
    stop = threading.Event()

    def killer():
        # kill mid-epoch: once the workers' step reports reach the sink, and again two steps on
        while not stop.is_set() and len(kills) < 2:
            names = [n for n in ray.util.list_named_actors() if n.startswith("orchard-sink-")]
            try:
                sink = ray.get_actor(names[0]) if names else None
                step = ray.get(sink.get_progress.remote(), timeout=10).get("step", 0) if sink else 0
            except Exception:  # restarting, or the run is over
                step = 0
            if step >= (kills[-1] + 2 if kills else 1):
                ray.kill(sink, no_restart=False)
                kills.append(step)
            stop.wait(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        # ~10 steps an epoch: both kills land in the first two or three epochs, the rest is margin
        res = run_orchard("workload=flower", "strategy=ring", "debug=smoke", "flower.epochs=8")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert kills, "the sink was never killed: the run ended before the first kill"
    assert res.exit_code == 0, res.outcome.error
    assert res.run.info.status == "FINISHED"
    assert "test/mae" in res.run.data.metrics and res.history("train/loss")


# --------------------------------------------------------------------------- the store under load
@pytest.fixture
def store(tmp_path):
    """A migrated sqlite MLflow store: ``(uri, path)``."""
    from orchard.tracking.store import check_store

    path = tmp_path / "store" / "mlflow.db"
    uri = f"sqlite:///{path}"
    check_store(uri)
    return uri, path


def test_a_store_another_process_holds_locked_is_a_config_error_before_anything_starts(store):
    import sqlite3

    from orchard.errors import ConfigError
    from orchard.tracking.store import check_store

    uri, path = store
    blocker = sqlite3.connect(path)
    blocker.execute("BEGIN EXCLUSIVE")  # a sqlite3 shell (or a stuck process) mid-transaction
    try:
        with pytest.raises(ConfigError) as err:
            check_store(uri, lock_wait_s=0.2)
    finally:
        blocker.rollback()
        blocker.close()
    assert err.value.key == "tracking.uri"
    assert f"{path} stayed locked" in str(err.value) and "\n" not in str(err.value)
    check_store(uri, lock_wait_s=0.2)  # the lock gone, the store is usable


@contextmanager
def _read_only(path: Path):
    """``path`` read-only for this process.  Permission bits do not bind root, so as root the
    file system's immutable flag does it."""
    mode = path.stat().st_mode
    path.chmod(mode & ~0o222)
    immutable = os.geteuid() == 0
    if immutable and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        path.chmod(mode)
        pytest.skip("running as root on a file system without chattr +i: nothing can be made read-only")
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_read_only_store_is_a_config_error_before_anything_starts(store, what):
    from orchard.errors import ConfigError
    from orchard.tracking.store import check_store

    uri, path = store
    with _read_only(path if what == "file" else path.parent), pytest.raises(ConfigError) as err:
        check_store(uri, lock_wait_s=0.2)
    assert err.value.key == "tracking.uri" and "\n" not in str(err.value)
    assert str(path if what == "file" else path.parent) in str(err.value)


def test_resume_never_creates_a_store(tmp_path):
    from orchard.errors import ConfigError
    from orchard.tracking.store import check_store

    path = tmp_path / "elsewhere" / "mlflow.db"
    with pytest.raises(ConfigError, match="tracking.uri: the MLflow store the run was logged to; there is none"):
        check_store(f"sqlite:///{path}", create=False)
    assert not path.parent.exists()


def test_a_write_that_meets_a_lock_is_retried_until_the_lock_is_gone(tmp_path, monkeypatch):
    """A real sqlite lock, a real write that fails on it at once (no busy wait), and the one
    retry helper that every store write goes through."""
    import sqlite3

    from orchard.tracking import store as tracking_store

    monkeypatch.setattr(tracking_store, "RETRY_WAITS_S", (0.05, 0.1, 0.2, 0.4))
    db = tmp_path / "store.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE runs (status TEXT)")
    other = sqlite3.connect(db)
    other.execute("BEGIN EXCLUSIVE")  # another run mid-write
    attempts = []

    def close_run():
        attempts.append(1)
        try:
            with sqlite3.connect(db, timeout=0) as con:
                con.execute("INSERT INTO runs VALUES ('FINISHED')")
        finally:
            if len(attempts) == 1:  # the other run's write ends while this one waits
                other.rollback()

    tracking_store.retried(close_run)
    assert len(attempts) == 2
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("FINISHED",)]
    other.close()

    def bad_name():
        attempts.append(1)
        raise ValueError("not a store error")

    with pytest.raises(ValueError):  # anything but a lock or an unavailable store is raised at once
        tracking_store.retried(bad_name)
    assert len(attempts) == 3


def test_a_multirun_job_takes_the_single_runs_path_fit_check_and_teardown_included(ray_session, tmp_path,
                                                                                   monkeypatch, capsys):
    """Each job goes through lifecycle.execute, as a single run does: a flower job whose Train
    group cannot fit this Ray gets the fit check's one line (exit 2) instead of a run waiting for
    workers, and every job's Ray teardown (threads joined, Train runs aborted) runs after it."""
    import ray

    from orchard import background, multirun

    ended = []
    join_all = background.join_all
    monkeypatch.setattr(background, "join_all", lambda *a, **k: ended.append(1) or join_all(*a, **k))
    code = multirun.run_multirun(["workload=flower", "strategy.num_workers=63,64", "tracking=none",
                                  f"output_dir={tmp_path}/out"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("orchard: bad config")]
    assert code == 2
    assert len(lines) == 2 and all("strategy: workers that fit this machine" in line for line in lines), lines
    assert "63 CPU" in lines[0] and "64 CPU" in lines[1]
    assert len(ended) == 3  # each job's Ray session ended, then the multirun's; the Ray itself (the fixture's) runs on
    assert ray.is_initialized()


@pytest.mark.parametrize("said", ["(sqlite3.OperationalError) duplicate column name: outputs",
                                  "Online migration expected to match one row when updating '2b4d017a5e9b' to "
                                  "'cfd24bdc0731' in 'alembic_version'; 0 found"])
def test_a_fresh_store_migrated_by_another_process_at_once_is_waited_for(said, tmp_path, monkeypatch):
    """MLflow's migration of a fresh sqlite store fails with "duplicate column name" (or "table
    ... already exists") when a process outside orchard's lock (a watcher polling the store, a
    notebook) migrates it at the same moment (seen in ../shared/checks/node-loss): check_store
    waits for the other one to finish and goes on, instead of failing the run."""
    import mlflow.tracking

    from orchard.tracking import store

    real, calls = mlflow.tracking.MlflowClient, []

    class Racing:
        def __init__(self, uri):
            calls.append(uri)
            if len(calls) == 1:
                raise RuntimeError(said)  # sqlalchemy's OperationalError, alembic's CommandError
            self.client = real(uri)

        def search_experiments(self, **kwargs):
            return self.client.search_experiments(**kwargs)

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", Racing)
    monkeypatch.setattr(store.time, "sleep", lambda s: None)
    store.check_store(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(calls) == 2 and (tmp_path / "mlflow.db").is_file()
