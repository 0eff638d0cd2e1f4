"""Ray Tune sweeps: parent + one child run per trial, a leaderboard, resume after a crash."""
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchard.cli import prepare
from orchard.errors import ConfigError
from tests.tiny_workload.cli import tiny_cli, tiny_cli_env



def _sweep_overrides(*extra):
    return ["workload=tiny", "sweep=tiny_grid", *extra]


def test_sweep_config_validation_names_the_key():
    with pytest.raises(ConfigError) as err:
        prepare(["workload=tiny", "sweep=tiny_typo"])
    assert err.value.key == "sweep.params.tiny.lrr"
    with pytest.raises(ConfigError) as err:
        prepare(_sweep_overrides("sweep.mode=best"))
    assert err.value.key == "sweep.mode"


@pytest.mark.slow
def test_four_trial_sweep_gives_parent_children_and_leaderboard(run_orchard, capsys):
    res = run_orchard(*_sweep_overrides("tiny.steps=20", "tracking.system_metrics=false"))
    assert res.exit_code == 0
    parent = res.run
    assert parent.info.status == "FINISHED"
    children = res.client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert sorted(float(c.data.params["tiny.lr"]) for c in children) == [0.01, 0.05, 0.1, 0.3]
    best_child = min(children, key=lambda c: c.data.metrics["train/loss"])
    assert parent.data.tags["best_run_id"] == best_child.info.run_id
    assert parent.data.metrics["best/train/loss"] == pytest.approx(best_child.data.metrics["train/loss"])
    out = capsys.readouterr().out
    assert "rank" in out and "tiny.lr" in out and best_child.info.run_id[:12] in out
    board = json.loads(Path(res.client.download_artifacts(parent.info.run_id, "leaderboard.json")).read_text())
    assert len(board) == 4 and board[0]["run_id"] == best_child.info.run_id


@pytest.mark.slow
def test_interrupted_sweep_resumes_where_it_stopped(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = tiny_cli("workload=tiny", "sweep=tiny_grid", "sweep.max_concurrent_trials=1",
            "tiny.steps=40", "tiny.sleep_s=0.05", "tracking.system_metrics=false",
            f"tracking.uri={uri}", f"output_dir={tmp_path}/out", "cluster.num_cpus=2")
    env = tiny_cli_env()
    client = MlflowClient(uri)

    def finished_children():
        try:
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                      "attributes.status = 'FINISHED'")
        except Exception:
            return []
        return [r for r in runs if "mlflow.parentRunId" in r.data.tags]

    first = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and len(finished_children()) < 1:
        time.sleep(1)
    done_before = {r.data.params["tiny.lr"] for r in finished_children()}
    assert 1 <= len(done_before) < 4, "the sweep should be part-way when interrupted"
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    second = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming" in second.stdout
    done = finished_children()
    lrs = [r.data.params["tiny.lr"] for r in done]
    assert sorted(set(lrs)) == ["0.01", "0.05", "0.1", "0.3"]
    for lr in done_before:  # finished trials were not trained again
        assert lrs.count(lr) == 1
    parents = {r.data.tags["mlflow.parentRunId"] for r in done}
    assert len(parents) == 1  # one sweep, one parent run, across both invocations
