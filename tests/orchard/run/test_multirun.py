"""Hydra's --multirun (orchard/run/multirun.py): every grid point is a run of its own with the single
run's layout, and each job takes the single run's path (preflight with its fit check, execute with
its teardown)."""
import pytest
import yaml


@pytest.mark.slow
def test_hydra_multirun_runs_each_grid_point(ray_session, tracking_uri, tracking_dir, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from orchard import background
    from orchard.run.multirun import run_multirun

    ended = []
    join_all = background.join_all
    monkeypatch.setattr(background, "join_all", lambda *a, **k: ended.append(1) or join_all(*a, **k))
    monkeypatch.chdir(tmp_path)
    code = run_multirun(["workload=tiny", "tiny.steps=7,9", "tracking.system_metrics=false",
                         f"tracking.uri={tracking_uri}", f"output_dir={tmp_path}/out", "run_name=multirun-test"])
    assert code == 0
    client = MlflowClient(tracking_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "attributes.run_name = 'multirun-test'")
    assert sorted(r.data.params["tiny.steps"] for r in runs) == ["7", "9"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert len(ended) == 3  # each job's Ray teardown (threads joined, Train runs aborted), then the multirun's
    # one layout for single runs and multirun jobs: <output_dir>/<workload>/<run id>/.hydra/, nothing in the cwd
    assert not (tmp_path / "multirun").exists() and not list(tmp_path.glob("*.log"))
    for run in runs:
        folder = tmp_path / "out" / "tiny" / run.info.run_id
        assert run.data.tags["orchard.run_dir"] == str(folder)
        assert sorted(p.name for p in (folder / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
        hydra = yaml.safe_load((folder / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert hydra["mode"] == "MULTIRUN" and hydra["runtime"]["output_dir"] == str(folder)
        assert f"tiny.steps={run.data.params['tiny.steps']}" in hydra["overrides"]["task"]


def test_multirun_jobs_that_cannot_fit_are_refused_one_by_one_before_ray(ray_session, tmp_path, monkeypatch, capsys):
    """Each job's preflight is the single run's: a flower job whose Train group cannot fit this
    machine gets the fit check's one line (exit 2) before any Ray session is entered for it."""
    from orchard import background
    from orchard.run import multirun

    ended = []
    monkeypatch.setattr(background, "join_all", lambda *a, **k: ended.append(1) or [])
    code = multirun.run_multirun(["workload=flower", "strategy.num_workers=63,64", "tracking=none",
                                  f"output_dir={tmp_path}/out"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("orchard: bad config")]
    assert code == 2
    assert len(lines) == 2 and all("strategy: workers that fit this machine" in line for line in lines), lines
    assert "63 CPU" in lines[0] and "64 CPU" in lines[1]
    assert ended == []  # no job reached a Ray session
