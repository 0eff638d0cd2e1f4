"""``python -m orchard resume <run id>`` against a store a teammate can write: what it takes back
(an allow-list, never a ``${...}``), what it makes the user give again, a run whose driver died
before closing it, and the new lr a resume asks for reaching the restored optimizer."""
import json
import os

import pytest
import torch
from mlflow.tracking import MlflowClient

import tests.tiny_workload as tiny
from orchard.run import resume
from orchard.tracking import leases, mlflow_run

PLANTED = [  # what a teammate with write access to the store adds to a run's orchard.overrides
    "cluster=remote", "cluster.address=ray://127.0.0.1:45555", "storage.uri=s3://attacker/loot",
    "run_name=${oc.env:PLANTED_SECRET}", "+cluster.runtime_env.env_vars.X=1", "+tiny.layer_modules=[rt_evil_mod]",
    "tiny.steps=${oc.env:PLANTED_SECRET}", "hydra.searchpath=[file:///tmp/evil]"]


def _stopped_run(uri: str, overrides: list[str], run_dir, status: str = "KILLED", **tags) -> str:
    client = MlflowClient(uri)
    run = client.create_run(mlflow_run.ensure_experiment(client, "resume", None), tags={
        "orchard.overrides": json.dumps(overrides), "orchard.run_dir": str(run_dir), **tags}).info.run_id
    if status != "RUNNING":
        client.set_terminated(run, status=status)
    return run


def test_the_store_gives_back_only_what_the_run_is():
    from orchard.run import from_the_store

    recorded = ["workload=tiny", "strategy=tasks", "strategy.num_workers=2", "debug=smoke", "seed=3", "tiny.steps=7",
                "progress=never", "output_dir=/o", "tracking.artifact_location=/a", *PLANTED]
    held = from_the_store.held_back(recorded, ["tracking.uri=sqlite:///m.db", "output_dir=/mine"])
    assert held == ["tracking.artifact_location=/a", *PLANTED]  # output_dir: the command line gives it


def test_resume_takes_nothing_else_from_the_store_and_names_what_to_give_again(tracking_uri, tmp_path, capsys,
                                                                               monkeypatch):
    """Planted keys (where Ray connects, where checkpoints are read, where outputs go, the
    environment, modules, Hydra's search path) and ``${oc.env:...}`` are not applied: exit 2 before
    anything starts, one line naming each, no secret resolved; a recorded config folder is named."""
    monkeypatch.setenv("PLANTED_SECRET", "MARKQ9")
    planted_dir = tmp_path / "planted"
    run = _stopped_run(tracking_uri, ["workload=tiny", "tiny.steps=7", f"output_dir={planted_dir}", *PLANTED],
                       tmp_path, **{"orchard.config_dirs": json.dumps([str(tmp_path / "planted-conf")])})
    assert resume.resume(run, [f"tracking.uri={tracking_uri}"]) == 2
    err = capsys.readouterr().err
    assert "MARKQ9" not in err and not planted_dir.exists()
    refusal = err.strip().splitlines()[-1]
    named = refusal.split(": given on the command line")[0]
    for key in ("output_dir", "cluster.address", "storage.uri", "run_name", "cluster.runtime_env.env_vars.X",
                "tiny.layer_modules", "hydra.searchpath"):
        assert key in named, key
    assert "tiny.steps" in named and "tiny.steps=7" not in refusal  # its ${...} twin, not itself
    assert f"--config-dir {tmp_path / 'planted-conf'}" in err and "~key" in refusal
    assert leases.read(MlflowClient(tracking_uri), run) is None  # the refusal let the lease go


def test_given_again_on_the_command_line_the_resume_goes_on_with_the_allowed_keys(tracking_uri, tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(tiny, "resume", lambda cfg, folder: seen.update(folder=folder), raising=False)
    run = _stopped_run(tracking_uri, ["workload=tiny", "tiny.steps=7", "seed=3", f"output_dir={tmp_path}/x"], tmp_path)
    client = MlflowClient(tracking_uri)
    cfg, module = resume._resume_config(client.get_run(run), tracking_uri, ["~output_dir"])  # without it
    assert (cfg["tiny"]["steps"], cfg["seed"], cfg["output_dir"]) == (7, 3, "outputs")
    cfg, module = resume._resume_config(client.get_run(run), tracking_uri, [f"output_dir={tmp_path}/mine"])
    assert (cfg["tiny"]["steps"], cfg["seed"], cfg["output_dir"]) == (7, 3, f"{tmp_path}/mine")
    assert cfg["_resumes"] == run and seen["folder"] == str(tmp_path) and module is tiny


def test_a_run_left_running_by_a_dead_driver_on_this_host_is_closed_then_resumed(tracking_uri, tmp_path, capsys):
    """A driver SIGKILLed in its first minute: its run says RUNNING; its pid (here: ours, started
    at another time) is not that driver. resume closes it FAILED with the reason and goes on."""
    from orchard.tracking import lost_runs

    tags = {**lost_runs.driver_tags(), "orchard.pid_start": "1.000"}
    run = _stopped_run(tracking_uri, ["workload=tiny"], tmp_path, status="RUNNING", **tags)
    client, old = resume._stopped_run(run, tracking_uri)
    assert old.info.status == "FAILED" and "driver lost" in old.data.tags["orchard.error"]
    assert f"run {run} was RUNNING, but driver lost" in capsys.readouterr().err
    alive = _stopped_run(tracking_uri, ["workload=tiny"], tmp_path, status="RUNNING", **lost_runs.driver_tags())
    with pytest.raises(resume.ConfigError, match=f"is RUNNING, driven by pid {os.getpid()}"):
        resume._stopped_run(alive, tracking_uri)  # this process: alive, left alone


@pytest.mark.slow
def test_the_run_folder_is_in_the_store_from_the_runs_first_moment(run_orchard, monkeypatch):
    """Written when the run opens, not through the metrics sink: a run killed at once is resumable."""
    seen = {}

    def run(cfg, ctx):
        seen["run_dir"] = MlflowClient(ctx.tracking_uri).get_run(ctx.run_id).data.tags.get("orchard.run_dir")
        return {}

    monkeypatch.setattr(tiny, "run", run)
    result = run_orchard("workload=tiny")
    assert result.exit_code == 0 and seen["run_dir"] == result.run.data.tags["orchard.run_dir"]


@pytest.mark.slow
def test_a_resume_trains_with_the_new_lr_on_the_restored_optimizer_state():
    """``resume <id> flower.optimizer.lr=...`` (what a diverged run's line asks for): the restored
    optimizer keeps its momentum, and steps with the new lr, not the checkpoint's."""
    from orchard.strategies.worker import RingReplica

    first = RingReplica(torch.nn.Linear(2, 1), {"name": "sgd", "lr": 0.5, "momentum": 0.9}, {})
    first.model(torch.ones(1, 2)).sum().backward()
    first.step()
    again = RingReplica(torch.nn.Linear(2, 1), {"name": "sgd", "lr": 0.01, "momentum": 0.9}, {})
    again.load_state_dict(first.state_dict())
    assert again.optimizer.param_groups[0]["lr"] == 0.01
    restored = [s["momentum_buffer"] for s in again.optimizer.state.values()]
    assert [b.tolist() for b in restored] == [s["momentum_buffer"].tolist() for s in first.optimizer.state.values()]
