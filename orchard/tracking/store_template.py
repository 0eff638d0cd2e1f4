"""A new sqlite store as a copy of an empty one, migrated once per MLflow version.

MLflow creates a sqlite store by running its ~60 alembic migrations: 1.3 s on an idle 2-core
machine, 7 s on a busy one, paid by the first run of every new store (each sweep folder, each
project, every test). The migrated, empty store is the same file every time but for one row, the
default experiment, whose artifact location MLflow derives from the working directory of the
process that created it. So orchard migrates one store per MLflow version into its cache
(``$XDG_CACHE_HOME/orchard/mlflow-stores/``) and fills each new store with a copy of it, that
row written as MLflow would have written it here. A store made this way and one MLflow made
hold the same tables, versions and rows (tests/orchard/tracking/test_store_template.py).
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path


def cache_folder() -> Path:
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "orchard" / "mlflow-stores"


def template() -> Path:
    """The empty, migrated store of this MLflow version, made once (under a lock, renamed into
    place whole, so concurrent first runs make it once and never read half of it)."""
    import mlflow
    from filelock import FileLock
    from mlflow.tracking import MlflowClient

    folder = cache_folder()
    made = folder / f"mlflow-{mlflow.__version__}.db"
    if made.is_file():
        return made
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with FileLock(str(made) + ".lock", timeout=300):
        if not made.is_file():
            partial = folder / f".{made.name}.{os.getpid()}.tmp"
            partial.unlink(missing_ok=True)
            MlflowClient(f"sqlite:///{partial}").search_experiments(max_results=1)  # MLflow creates and migrates it
            os.replace(partial, made)
    return made


def default_artifact_location() -> str:
    """The artifact location MLflow gives the default experiment (id 0) of a store it creates in
    this process: ``<artifact root>/0``, the root being the server's (inside ``mlflow server``)
    or ``./mlruns`` of the working directory (mlflow/tracking/_tracking_service/utils.py)."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    root = os.environ.get("_MLFLOW_SERVER_ARTIFACT_ROOT", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
    return append_to_uri_path(resolve_uri_if_local(root), "0")


def fill_new_store(path: Path) -> None:
    """Make the empty file ``path`` (orchard's new store, its owner's alone) a copy of the
    template with this process's default experiment. The copy is written beside it and renamed
    over it, so a reader sees an empty file or a whole store; the caller holds the store's lock."""
    source = template()
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
        now = int(time.time() * 1000)
        con = sqlite3.connect(partial)
        try:
            con.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                        "WHERE experiment_id = 0", (default_artifact_location(), now, now))
            con.commit()
        finally:
            con.close()
        os.chmod(partial, path.stat().st_mode & 0o777)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
