"""The MLflow tracking store itself: its address, the pre-flight check, writes tried again while
it is busy, and the MLflow UI that shows it.

Everything that writes to the store (the run's opening and closing in ``tracking.py``, the
metrics sink, the heartbeat and reaper in ``runs.py``, the dataset input, the summary) writes
through ``retried``; nothing here knows about runs, so any of them can import it.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

from orchard import config as config_lib


# Waits between the attempts of a store write (s): 5 attempts, 7.5 s of waiting.  With sqlite each
# attempt already waits up to 20 s on a lock (MLflow's busy_timeout), so a store locked for good
# costs a write under 2 minutes, then the error.
# the store a run uses unless told otherwise: conf/tracking/mlflow.yaml's `uri` (a test keeps them equal),
# named here for the commands that read a store without composing a config (runs, resume)
DEFAULT_URI = "sqlite:///mlflow.db"

RETRY_WAITS_S = (0.5, 1.0, 2.0, 4.0)
# How long the pre-flight waits for another process's lock on a sqlite store (MLflow's busy_timeout).
STORE_LOCK_WAIT_S = 20.0

_LOCKED = ("database is locked", "database table is locked", "database is busy", "deadlock", "lock wait timeout")
# sqlite errors that MLflow reports as "temporarily unavailable" but that no retry mends
_BROKEN = ("readonly database", "unable to open database file", "file is not a database", "no such table")


def resolve_uri(uri: str) -> str:
    """Make a relative sqlite path absolute so Ray actors in other folders write the same file."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


def transient(exc: BaseException) -> bool:
    """Whether a store error may pass if the write is tried again: a database lock, a database
    that is briefly unavailable, a dropped connection.  An http(s) store's errors are not:
    MLflow's client has already retried those (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``)."""
    from mlflow.exceptions import MlflowException, RestException

    text = str(exc).lower()
    if any(s in text for s in _LOCKED):
        return True
    if any(s in text for s in _BROKEN) or isinstance(exc, RestException):
        return False
    if isinstance(exc, MlflowException):
        return exc.error_code == "TEMPORARILY_UNAVAILABLE"  # how MLflow's SQL stores report a busy database
    return isinstance(exc, (ConnectionError, TimeoutError))


def refused(exc: BaseException) -> bool:
    """Whether MLflow refused the request itself (an invalid name or value, a deleted run):
    sending it again can never succeed."""
    from mlflow.exceptions import MlflowException

    if not isinstance(exc, MlflowException) or transient(exc):
        return False
    status = exc.get_http_status_code()
    return 400 <= status < 500 and status not in (408, 429)


def retried(call, *args, **kwargs):
    """``call(*args, **kwargs)``, tried again after each of ``RETRY_WAITS_S`` while the store's
    error is ``transient``; any other error, or the last one, is raised."""
    for wait in RETRY_WAITS_S:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not transient(exc):
                raise
        time.sleep(wait)
    return call(*args, **kwargs)


def quiet_store_logs() -> None:
    """MLflow logs each store creation step at INFO and every database error (a lock: 60 lines of
    SQL and traceback) before it raises; orchard reports the error it raises in one line."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


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


# What MLflow's migration of a fresh sqlite store says when another process migrates it at once
# (SQLite's, then alembic's words: a table or column the other made, a version it moved on)
HALF_MIGRATED = ("already exists", "duplicate column name", "no such column",
                 "Online migration expected to match one row")


def check_store(uri: str, timeout_s: float = 10.0, create: bool = True,
                lock_wait_s: float = STORE_LOCK_WAIT_S, open_now: bool = True) -> None:
    """Fail fast with one line (``ConfigError``) if the tracking store cannot be used.

    sqlite: the folder and the file must be writable, and no other process may hold the store
    locked for ``lock_wait_s``; a new store is created and migrated once, under a lock, unless
    ``create=False`` (``resume``: a store that is not there is an error, never made empty).
    http(s): an MLflow server must answer ``/health`` within ``timeout_s``.

    ``open_now=False``: only the checks that need no MLflow (the server's answer, the folder, a
    write begun and rolled back); ``open_store`` (a ``StoreOpening`` beside Ray's start: the
    lifecycle's ``execute``) does the rest."""
    from orchard.errors import ConfigError

    uri = resolve_uri(uri)
    if uri.startswith(("http://", "https://")):
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
                if reply.status != 200:
                    raise OSError(f"HTTP {reply.status}")
        except Exception as exc:
            raise ConfigError("tracking.uri", f"an MLflow server that answers; none did at {uri} ({first_line(exc)}); "
                              "start one (README: team tracking) or use tracking.uri=sqlite:///mlflow.db") from None
        return
    if uri.split(":", 1)[0].split("+", 1)[0] in DATABASES:
        _check_database(uri, timeout_s)
        return
    if uri.startswith("file:") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("true", "1"):
        # MLflow 3 refuses its file store unless told otherwise, from the first call that opens it
        # (a run's lost-runs check and its opening, once Ray was up: an internal error, exit 1)
        raise ConfigError("tracking.uri", f"a database or server store; MLflow keeps the file store ({uri}) in "
                          "maintenance mode and refuses it: use sqlite:///mlflow.db (`mlflow migrate-filestore` "
                          "moves an existing one losslessly), or set MLFLOW_ALLOW_FILE_STORE=true to keep it")
    path = _sqlite_path(uri)
    if path is None:
        return
    if not create and not path.is_file():
        raise ConfigError("tracking.uri", f"the MLflow store the run was logged to; there is none at {path} "
                          "(give tracking.uri=sqlite:////<absolute path>/mlflow.db)")
    try:
        config_lib.ensure_writable(path.parent)
    except OSError as exc:
        raise ConfigError("tracking.uri", f"a sqlite file in a writable folder; {path.parent}: {exc.strerror}") from None
    if path.exists():
        _probe_write(path, lock_wait_s)
    if open_now:
        open_store(uri, create, lock_wait_s)


# A database server as the store (MLflow's SQLAlchemy stores): ``postgresql://``, ``mysql://``,
# ``mssql://``, each with SQLAlchemy's default driver or the one named after a ``+``
DATABASES = ("postgresql", "mysql", "mssql")


def _check_database(uri: str, timeout_s: float) -> None:
    """A database store's driver is installed and its server takes a connection within
    ``timeout_s``; else one line naming ``tracking.uri`` (its password masked), before Ray
    starts, as for a server store that does not answer. Without this a missing driver was an
    internal error once Ray had started."""
    import sqlalchemy

    from orchard import background
    from orchard.config import redact
    from orchard.errors import ConfigError

    shown = redact.text(uri)
    try:
        url = sqlalchemy.engine.make_url(uri)
        url.get_dialect().import_dbapi()
    except ModuleNotFoundError as exc:
        raise ConfigError("tracking.uri", f"a database store whose driver is installed; {shown} needs its "
                          f"driver, the Python module {exc.name!r}, which is not installed (install it, or "
                          f"name an installed driver: {url.get_backend_name()}+<driver>://...)") from None
    except Exception as exc:
        raise ConfigError("tracking.uri", f"a database URI SQLAlchemy can use; {shown}: "
                          f"{redact.text(first_line(exc))}") from None   # a parse error quotes the URI whole

    def connect() -> None:
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()

    try:  # bounded: each driver names its connect timeout differently, and some have none
        background.bounded(connect, timeout_s=timeout_s, name="orchard-store-check")
    except TimeoutError:
        raise ConfigError("tracking.uri", f"a database that answers; {shown} did not within {timeout_s:g} s") from None
    except Exception as exc:
        raise ConfigError("tracking.uri", f"a database that answers; {shown} did not "
                          f"({redact.text(first_line(getattr(exc, 'orig', None) or exc))})") from None  # the driver's words


def open_store(uri: str, create: bool = True, lock_wait_s: float = STORE_LOCK_WAIT_S) -> None:
    """A sqlite store opened once through MLflow (created from the template and migrated under a
    lock where new), so that what a run writes next finds it ready; ``ConfigError`` where it is
    locked for ``lock_wait_s``. Other stores: nothing to do. Most of its time is MLflow's import
    and SQLAlchemy's first engine (~2 s here)."""
    from orchard.errors import ConfigError

    uri = resolve_uri(uri)
    path = _sqlite_path(uri)
    if path is None or (not create and not path.is_file()):
        return
    from mlflow.tracking import MlflowClient

    from orchard.config import redact

    quiet_store_logs()
    if create and not path.exists():  # its owner's alone before MLflow fills it (sqlite's side files take its mode)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, redact.PRIVATE_FILE))
        except FileExistsError:  # another process made it this instant
            pass
    deadline = time.monotonic() + 30.0
    while True:
        try:
            with store_lock(uri):
                if create and path.stat().st_size == 0:  # new: a copy of an empty, migrated store
                    from orchard.tracking.store_template import fill_new_store

                    fill_new_store(path)
                MlflowClient(uri).search_experiments(max_results=1)  # creates and migrates the store once
            return
        except Exception as exc:
            if transient(exc):  # locked by another process while MLflow waited its own 20 s
                raise ConfigError("tracking.uri", _locked(path, lock_wait_s)) from None
            # A process that is not orchard (a notebook's MlflowClient, a watcher) creating the same
            # fresh store at this moment, outside orchard's lock: MLflow's migration then finds its
            # tables, columns or versions half moved (``HALF_MIGRATED``). The other one finishes
            # it: wait, retry.
            if not any(s in str(exc) for s in HALF_MIGRATED) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


class StoreOpening:
    """``open_store`` in a thread, begun just before Ray starts: MLflow's import and the store's
    first open (~2 s on 2 cores) overlap Ray's start (~3 s, most of it waiting for its processes)
    rather than precede it. ``wait`` returns once the store is open and raises what opening it
    raised (a ``ConfigError``: a lock held too long, a store being migrated by another process)."""

    def __init__(self, uri: str | None):
        import threading

        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, args=(uri,), name="orchard-store-open", daemon=True)
        if uri is not None:
            self._thread.start()

    def _open(self, uri: str) -> None:
        try:
            open_store(uri)
        except BaseException as exc:  # noqa: BLE001 - handed to wait(), in the thread that can act on it
            self._error = exc

    def wait(self) -> None:
        self.wait_quietly()
        if self._error is not None:
            raise self._error

    def wait_quietly(self) -> None:
        """Until it is done, whatever it raised (the run will not go on)."""
        if self._thread.ident is not None:
            self._thread.join()


def _probe_write(path: Path, lock_wait_s: float) -> None:
    """Begin a write on the sqlite file and roll it back: a read-only file, a folder where the
    journal cannot be made, or another process's lock shows here, before Ray starts."""
    import sqlite3

    from orchard.errors import ConfigError

    con = sqlite3.connect(str(path), timeout=lock_wait_s, isolation_level=None)  # sqlite retries a lock for lock_wait_s
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("CREATE TABLE orchard_write_probe (x)")  # touches a page: the journal is created
        con.execute("ROLLBACK")
    except sqlite3.Error as exc:
        if transient(exc):
            raise ConfigError("tracking.uri", _locked(path, lock_wait_s)) from None
        raise ConfigError("tracking.uri", f"a sqlite store orchard can write; {path}: {first_line(exc)} "
                          f"(the file and its folder must be writable)") from None
    finally:
        con.close()


def _locked(path: Path, waited_s: float) -> str:
    return (f"a sqlite store no other process holds locked; {path} stayed locked for {waited_s:g} s "
            "(a process holds a write transaction open: a sqlite3 shell, a stuck run); end it or use another tracking.uri")


def first_line(exc: BaseException) -> str:
    """An error's first line, short enough for a one-line message."""
    text = str(getattr(exc, "reason", None) or exc).splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


UI_PORT = 5000   # MLflow's own default for `mlflow ui`
# MLflow 3.17's UI picks its GenAI or its "Model training" layout from a per-browser setting
# (GenAI unless the user switched) or this URL parameter; the experiment's kind tag alone does
# not switch it (seen in headless Chromium), so orchard's links ask for model training.
UI_TRAINING_VIEW = "workflowType=machine_learning"


def ui_command_line(uri: str, run_id: str | None = None) -> str:
    """The command that opens the MLflow UI on this store (bound to localhost, in the training
    view; orchard/cli/ui.py), at the run's page when given (its id shortened, as ``runs`` shows it)."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    words = ["python -m orchard ui", run_id[:8] if run_id else None,
             None if uri == DEFAULT_URI else f"tracking.uri={uri}"]
    return " ".join(w for w in words if w)


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page in the MLflow UI: on the tracking server itself, or on the UI that
    ``ui_command_line`` starts (on port 5000 when it is free)."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else f"http://127.0.0.1:{UI_PORT}"
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{UI_TRAINING_VIEW}"
