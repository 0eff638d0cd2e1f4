"""orchard/tracking/mlflow_run.py on its own: the experiment a run lands in, what a run opens with
(its config as params and config.yaml with secrets masked, the command, its description, its
sweep parent) and how it closes. A new sqlite store in tmp_path read back with MlflowClient, the
tests' workload's composed config; no Ray. (artifact_root: test_storage.py; reopen_run:
test_sweep.py; a close's masking: test_redact.py.)"""
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchard.tracking import mlflow_run
from orchard.tracking.store import check_store

SECRET = "hf_n0t-for-the-store"


@pytest.fixture
def client(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)  # a new store as orchard makes one (a copy of an empty, migrated one)
    return MlflowClient(uri)


@pytest.fixture
def cfg(client, tmp_path):
    """The tiny workload's config as the lifecycle hands it over, with a secret on the command line."""
    from orchard.run.lifecycle import prepare

    cfg, _ = prepare(["workload=tiny", "tiny.lr=0.05", f"+cluster.runtime_env.env_vars.HF_TOKEN={SECRET}",
                      f"tracking.uri={client.tracking_uri}", f"tracking.artifact_location={tmp_path}/artifacts",
                      f"output_dir={tmp_path}/out"])
    return cfg


def test_a_new_experiment_opens_on_its_runs_table_and_one_made_by_hand_is_tagged_too(client):
    made = mlflow_run.ensure_experiment(client, "mine", None)
    assert client.get_experiment(made).tags[mlflow_run.EXPERIMENT_KIND_TAG] == mlflow_run.TRAINING_KIND
    assert mlflow_run.ensure_experiment(client, "mine", None) == made   # the same one next time
    by_hand = client.create_experiment("by-hand")
    assert mlflow_run.ensure_experiment(client, "by-hand", None) == by_hand
    assert client.get_experiment(by_hand).tags[mlflow_run.EXPERIMENT_KIND_TAG] == mlflow_run.TRAINING_KIND


def test_an_experiment_the_user_gave_another_kind_keeps_it(client):
    genai = client.create_experiment("agents", tags={mlflow_run.EXPERIMENT_KIND_TAG: "genai_development"})
    mlflow_run.ensure_experiment(client, "agents", None)
    assert client.get_experiment(genai).tags[mlflow_run.EXPERIMENT_KIND_TAG] == "genai_development"


def test_a_runs_params_are_its_config_flattened_with_secrets_masked_and_no_bookkeeping(client, cfg):
    from orchard.config import redact
    from orchard.config import flatten

    run = client.get_run(mlflow_run.open_run(cfg, "r").run_id)
    params = run.data.params
    shown = redact.config({k: v for k, v in cfg.items() if not k.startswith("_")})
    assert params == {k: str(v) for k, v in flatten(shown).items()}
    assert params["tiny.lr"] == "0.05" and params["cluster.runtime_env.env_vars.HF_TOKEN"] == "***"
    assert SECRET not in repr(run.data)


def test_the_config_yaml_a_teammate_downloads_is_the_config_with_secrets_masked(client, cfg, tmp_path):
    run_id = mlflow_run.open_run(cfg, "r").run_id
    text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text()
    assert SECRET not in text
    logged = yaml.safe_load(text)
    assert logged["tiny"]["lr"] == 0.05 and logged["cluster"]["runtime_env"]["env_vars"]["HF_TOKEN"] == "***"
    assert not [k for k in logged if k.startswith("_")]


def test_a_run_says_the_command_that_made_it_and_what_it_is_in_one_line(client, cfg):
    tags = client.get_run(mlflow_run.open_run(cfg, "r").run_id).data.tags
    assert tags["orchard.command"].startswith("python -m orchard workload=tiny tiny.lr=0.05 "
                                              "+cluster.runtime_env.env_vars.HF_TOKEN=*** tracking.uri=")
    assert tags["mlflow.note.content"] == "**tiny** tasks · tiny.lr=0.05 +cluster.runtime_env.env_vars.HF_TOKEN=***"
    assert tags["mlflow.runName"] == "r" and tags["orchard.workload"] == "tiny" and tags["orchard.strategy"] == "tasks"


def test_a_sweeps_trial_is_its_parents_child_and_its_description_names_what_it_was_given(client, cfg):
    parent = client.create_run(mlflow_run.ensure_experiment(client, "tiny", cfg["tracking"]["artifact_location"])).info.run_id
    client.log_param(parent, "sweep.params.tiny.lr.type", "grid")
    client.log_param(parent, "tiny.lr", "0.1")
    trial = client.get_run(mlflow_run.open_run(cfg, "t_0", parent_run_id=parent).run_id)
    assert trial.data.tags["mlflow.parentRunId"] == parent
    assert trial.data.tags["mlflow.note.content"].endswith(" · trial tiny.lr=0.05")


def test_a_config_value_longer_than_mlflow_takes_is_logged_cut_not_refused(client, cfg):
    cfg["tiny"]["notes"] = "n" * 7000
    params = client.get_run(mlflow_run.open_run(cfg, "r").run_id).data.params
    assert params["tiny.notes"] == "n" * 6000


def test_a_run_closed_without_an_error_records_its_status_and_no_error(client):
    run = client.create_run(mlflow_run.ensure_experiment(client, "e", None)).info.run_id
    mlflow_run.close_run(mlflow_run.TrackedRun(run, "0", client.tracking_uri), "KILLED")
    closed = client.get_run(run)
    assert closed.info.status == "KILLED" and "orchard.error" not in closed.data.tags
    assert client.list_artifacts(run) == []


def test_a_failed_run_keeps_the_traceback_that_ended_it(client, tmp_path):
    def load_shard():
        raise ValueError("shard 3 is empty")

    run = client.create_run(mlflow_run.ensure_experiment(client, "e", str(tmp_path / "artifacts"))).info.run_id
    try:
        load_shard()
    except ValueError as exc:
        mlflow_run.close_run(mlflow_run.TrackedRun(run, "0", client.tracking_uri), "FAILED", exc)
    closed = client.get_run(run)
    assert closed.info.status == "FAILED" and closed.data.tags["orchard.error"] == "ValueError: shard 3 is empty"
    text = Path(client.download_artifacts(run, "error.txt", str(tmp_path))).read_text()
    assert text.startswith("Traceback") and "in load_shard" in text


def test_the_run_page_lists_the_workloads_params_first_and_its_operational_tags_last(client, cfg):
    """MLflow 3.17's UI lists a run's params and tags in the order the store first recorded them
    (the run page's tables and tag box sort none by name): the workload's own hyper-parameters
    lead the params, and once the run is closed the tags lead with what the run is (workload,
    strategy, command, the workload's own), the driver's host, pid, heartbeat and the versions
    after them, every value kept."""
    tracked = mlflow_run.open_run(cfg, "r")
    params = list(client.get_run(tracked.run_id).data.params)
    assert params[0].startswith("tiny.") and params.index("strategy.name") < params.index("cluster.mode")
    client.set_tag(tracked.run_id, "tiny.preparation", "made")   # a workload's own, set as it runs
    before = client.get_run(tracked.run_id).data.tags
    mlflow_run.close_run(tracked, "FINISHED")
    tags = client.get_run(tracked.run_id).data.tags
    assert tags == before
    shown = [k for k in tags if not k.startswith("mlflow.")]   # the UI hides mlflow.* tags
    operational = [k for k in shown if k in mlflow_run.OPERATIONAL_TAGS]
    assert {"orchard.host", "orchard.pid", "orchard.heartbeat", "ray.version"} <= set(operational)
    assert shown[:len(shown) - len(operational)] == [k for k in shown if k not in operational]
    assert shown.index("tiny.preparation") < shown.index("orchard.host")
    assert shown[:3] == ["orchard.workload", "orchard.strategy", "orchard.command"]
