"""The tracking store before and under a run (orchard/tracking/store.py): a store that is locked,
read-only or absent (for resume) is found before anything starts; a write that meets a lock is
tried again; a fresh store another process migrates at once is waited for."""
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest


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


@pytest.mark.parametrize("said", ["(sqlite3.OperationalError) duplicate column name: outputs",
                                  # a backfill reading a column the other process has not added yet
                                  # (seen in CI: test_ctrl_c_marks_the_run_killed's own client raced the run)
                                  "(sqlite3.OperationalError) no such column: spans.dimension_attributes",
                                  "Online migration expected to match one row when updating '2b4d017a5e9b' to "
                                  "'cfd24bdc0731' in 'alembic_version'; 0 found"])
def test_a_fresh_store_migrated_by_another_process_at_once_is_waited_for(said, tmp_path, monkeypatch):
    """MLflow's migration of a fresh sqlite store fails with "duplicate column name", "no such
    column" (or "table ... already exists") when a process outside orchard's lock (a watcher polling the store, a
    notebook) migrates it at the same moment (seen in the node-loss acceptance check): check_store
    waits for the other one to finish and goes on, instead of failing the run."""
    import mlflow.tracking

    from orchard.tracking import store, store_template

    store_template.template()  # a new store is a copy of it (store_template.py): made before MLflow is raced
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


def test_the_default_store_is_named_once_and_is_the_configs():
    """``DEFAULT_URI`` (what runs/resume read without composing a config) is conf/tracking/mlflow.yaml's."""
    import yaml

    from orchard.config import conf_dir
    from orchard.tracking.store import DEFAULT_URI

    assert yaml.safe_load((conf_dir() / "tracking" / "mlflow.yaml").read_text())["uri"] == DEFAULT_URI


def test_the_preflight_checks_a_new_store_without_making_it_and_the_opening_beside_ray_makes_it(tmp_path):
    """The run's store opens in a thread while Ray starts (lifecycle.execute): the preflight only
    checks the folder; ``StoreOpening`` then makes and migrates it, and hands its error to ``wait``."""
    from mlflow.tracking import MlflowClient

    from orchard.tracking.store import StoreOpening, check_store

    path = tmp_path / "new" / "mlflow.db"
    uri = f"sqlite:///{path}"
    check_store(uri, open_now=False)
    assert path.parent.is_dir() and not path.exists()
    StoreOpening(uri).wait()
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]
    StoreOpening(None).wait()   # tracking off: nothing to open
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(Exception, match="not a database"):
        StoreOpening(f"sqlite:///{garbage}").wait()


def test_a_store_that_fails_to_open_beside_ray_is_one_line_exit_2_and_no_run(ray_session, compose, tmp_path,
                                                                            monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from orchard.errors import ConfigError
    from orchard.run import lifecycle
    from orchard.tracking import store

    def locked(uri, *args, **kwargs):
        raise ConfigError("tracking.uri", "a store no other process holds locked; test")

    monkeypatch.setattr(store, "open_store", locked)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = compose("workload=tiny", f"tracking.uri={uri}", f"output_dir={tmp_path}/out")
    outcome = lifecycle.execute(cfg)
    assert outcome.exit_code == 2 and outcome.run_id is None
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "orchard: bad config: tracking.uri: a store no other process holds locked; test"
    monkeypatch.undo()
    assert not MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()])


def test_a_database_store_without_its_driver_is_one_line_exit_2_before_ray_starts(capfd, tmp_path):
    """A team's ``postgresql://`` store, where this Python has no driver for it (SQLAlchemy's
    default, psycopg): one line naming tracking.uri and the module, the password masked, exit 2,
    nothing started (it was an internal error, exit 1, once Ray was up)."""
    import importlib.util

    from tests.tiny_workload.cli import main_in_process

    if importlib.util.find_spec("psycopg") is not None:
        pytest.skip("psycopg is installed here: postgresql:// has its driver")
    code, err = main_in_process(["workload=forest", "debug=smoke", f"output_dir={tmp_path}/out",
                                 "tracking.uri=postgresql://team:s3cret@127.0.0.1:5432/mlflow"], capfd)
    assert code == 2 and not list((tmp_path / "out").rglob("*.log"))   # no run's log: nothing started
    assert err.strip() == ("orchard: bad config: tracking.uri: a database store whose driver is installed; "
                           "postgresql://team:***@127.0.0.1:5432/mlflow needs its driver, the Python module "
                           "'psycopg', which is not installed (install it, or name an installed driver: "
                           "postgresql+<driver>://...)")


@pytest.mark.parametrize("server", ["nothing listens", "never answers"])
def test_a_database_store_that_does_not_answer_is_a_config_error_naming_it(server, tmp_path):
    """With its driver installed (pg8000, pure Python, in the dev extra), a database server that
    refuses the connection, or takes it and says nothing, is one line within the check's wait."""
    import socket

    from orchard.errors import ConfigError
    from orchard.tracking.store import check_store

    pytest.importorskip("pg8000")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if server == "never answers":
            listener.listen()
        else:
            listener.close()
        with pytest.raises(ConfigError) as refused:
            check_store(f"postgresql+pg8000://team:s3cret@127.0.0.1:{port}/mlflow", timeout_s=1.0)
    said = str(refused.value)
    assert refused.value.key == "tracking.uri" and "s3cret" not in said
    assert said.startswith(f"tracking.uri: a database that answers; postgresql+pg8000://team:***@127.0.0.1:{port}/mlflow did not")
    if server == "never answers":
        assert said.endswith("did not within 1 s")


def test_mlflows_file_store_is_refused_before_anything_starts_unless_mlflow_is_told_to_keep_it(monkeypatch, tmp_path):
    """MLflow 3 refuses its file store from the first call that opens it (an internal error once
    Ray was up); orchard says so first, with the way on, and takes it where MLflow is told to."""
    from orchard.errors import ConfigError
    from orchard.tracking.store import check_store

    uri = f"file://{tmp_path}/mlruns"
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError) as refused:
        check_store(uri)
    assert str(refused.value).startswith(f"tracking.uri: a database or server store; MLflow keeps the file store "
                                         f"({uri}) in maintenance mode") and "MLFLOW_ALLOW_FILE_STORE=true" in str(refused.value)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "True")
    check_store(uri)
