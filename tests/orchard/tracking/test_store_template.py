"""A new store is a copy of an empty, migrated one (orchard/tracking/store_template.py): what a user
finds in it is what MLflow itself would have made, and its first run is recorded as in any store."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchard.tracking import store_template
from orchard.tracking.store import check_store


def _contents(db: Path) -> dict:
    con = sqlite3.connect(db)
    try:
        # a table's lines in any order: MLflow's own migrations order a table's CHECK constraints
        # differently from one process to the next
        schema = sorted((kind, name, sorted((sql or "").split("\n")))
                        for kind, name, sql in con.execute("SELECT type, name, sql FROM sqlite_master "
                                                           "WHERE name NOT LIKE 'sqlite_%'"))
        version = con.execute("SELECT version_num FROM alembic_version").fetchall()
        experiments = con.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments").fetchall()
    finally:
        con.close()
    return {"schema": schema, "version": version, "experiments": experiments}


@pytest.mark.slow
def test_a_new_store_is_what_mlflow_makes_in_this_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)   # MLflow derives the default experiment's artifact folder from here
    MlflowClient(f"sqlite:///{tmp_path}/by_mlflow.db").search_experiments()
    check_store(f"sqlite:///{tmp_path}/by_orchard.db")
    assert _contents(tmp_path / "by_orchard.db") == _contents(tmp_path / "by_mlflow.db")
    assert list((tmp_path / "cache" / "orchard" / "mlflow-stores").glob("mlflow-*.db"))   # made once, kept
    assert (tmp_path / "by_orchard.db").stat().st_mode & 0o777 == 0o600                  # its owner's alone
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".new")]                # no partial copy left


@pytest.mark.slow
def test_each_new_store_gets_its_own_default_experiment_and_takes_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        uri = f"sqlite:///{tmp_path / folder}/mlflow.db"
        check_store(uri)
        client = MlflowClient(uri)
        assert client.get_experiment("0").artifact_location == str(tmp_path / folder / "mlruns" / "0")
        run = client.create_run(client.create_experiment("e")).info.run_id
        client.log_metric(run, "train/loss", 0.5)
        assert client.get_run(run).data.metrics == {"train/loss": 0.5}
