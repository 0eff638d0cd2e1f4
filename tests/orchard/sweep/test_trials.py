"""orchard/sweep/trials.py: what a trial's next attempt continues after its process was lost."""
from __future__ import annotations

import pytest

from orchard.errors import ConfigError
from orchard.run.lifecycle import prepare


def test_the_retry_of_a_lost_attempt_reopens_its_run_and_a_closed_one_is_not_continued(tracking_uri, tmp_path):
    """What a trial's next attempt continues (``sweep.trials.retry_of``): the run its lost attempt left
    RUNNING (or a reaper closed as "driver lost"), reopened by ``reopen_run`` with the attempt's
    number; a run another invocation of the sweep left is not continued; one that failed by
    itself is its error again."""
    from mlflow.tracking import MlflowClient

    from orchard.sweep.trials import retry_of
    from orchard.tracking.lost_runs import LOST_REASON
    from orchard.tracking.mlflow_run import reopen_run

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("retries") or client.get_experiment(client.create_experiment("retries"))
    parent = client.create_run(exp.experiment_id).info.run_id
    cfg, module = prepare(["workload=tiny", f"tracking.uri={tracking_uri}", f"output_dir={tmp_path}"])

    def trial_run(trial_id: str, status: str, error: str = "") -> str:
        tags = {"mlflow.parentRunId": parent, "orchard.trial_id": trial_id, "orchard.sweep_session": "s1",
                "orchard.run_dir": str(tmp_path / trial_id)}
        run_id = client.create_run(exp.experiment_id, tags={**tags, **({"orchard.error": error} if error else {})}).info.run_id
        if status != "RUNNING":
            client.set_terminated(run_id, status)
        return run_id

    lost, reaped = trial_run("t_0", "RUNNING"), trial_run("t_1", "FAILED", LOST_REASON)
    trial_run("t_2", "FAILED", "RuntimeError: tiny workload asked to fail")
    assert retry_of(tracking_uri, parent, "t_0", "s1", "t_0", cfg, module) == {"reopen": lost, "attempt": 2}
    assert retry_of(tracking_uri, parent, "t_1", "s1", "t_1", cfg, module) == {"reopen": reaped, "attempt": 2}
    assert retry_of(tracking_uri, parent, "t_0", "another session", "t_0", cfg, module) == {}
    assert retry_of(tracking_uri, parent, "t_9", "s1", "t_9", cfg, module) == {}   # a first attempt
    with pytest.raises(RuntimeError, match="asked to fail.*not retried"):
        retry_of(tracking_uri, parent, "t_2", "s1", "t_2", cfg, module)
    reopen_run(cfg, reaped, 2)
    run = client.get_run(reaped)
    assert run.info.status == "RUNNING" and "orchard.error" not in run.data.tags
    assert run.data.tags["orchard.trial_attempt"] == "2" and run.data.metrics["trial/retries"] == 1
    assert retry_of(tracking_uri, parent, "t_1", "s1", "t_1", cfg, module)["attempt"] == 3

    # the workload's resume hook points the config at the lost attempt's folder; one that finds no
    # checkpoint there (lost before its first) leaves the config as it was: the trial starts over
    import types

    def resume(cfg, folder):
        cfg["tiny"]["resume"] = folder
        if not folder.endswith("t_0"):
            raise ConfigError("tiny.resume", "a folder holding a checkpoint")

    hooked = types.SimpleNamespace(resume=resume)
    assert retry_of(tracking_uri, parent, "t_0", "s1", "t_0", cfg, hooked)["attempt"] == 2
    assert cfg["tiny"]["resume"] == str(tmp_path / "t_0")
    del cfg["tiny"]["resume"]
    assert retry_of(tracking_uri, parent, "t_1", "s1", "t_1", cfg, hooked)["attempt"] == 3
    assert "resume" not in cfg["tiny"]
