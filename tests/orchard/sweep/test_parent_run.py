"""orchard/sweep/parent_run.py: the parent run records the leaderboard, and no best where every trial diverged."""
from __future__ import annotations

import json

from tests.orchard.sweep.test_leaderboard import finished_trials, INF, NAN


def test_a_sweep_whose_every_trial_diverged_has_no_best_and_says_so(tracking_uri, tracking_dir, tmp_path):
    """No ``best.*`` tags, no ``best/<metric>``, a strict-JSON leaderboard with null metrics."""
    from mlflow.tracking import MlflowClient

    from orchard.sweep.leaderboard import best_row, leaderboard, no_best_line
    from orchard.sweep.parent_run import ParentRun

    rows = leaderboard(finished_trials([NAN, INF, NAN]), ["tiny.lr"], "train/loss", "min")
    assert best_row(rows) is None and len(rows) == 3
    assert no_best_line(rows, "train/loss").startswith("no best trial: the train/loss of every one of the 3")
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("sweep-no-best") or client.get_experiment(
        client.create_experiment("sweep-no-best", artifact_location=(tracking_dir / "artifacts").as_uri()))
    parent = ParentRun(None, None)
    parent.client, parent.run_id = client, client.create_run(exp.experiment_id).info.run_id
    parent.record(rows, "train/loss", tmp_path)
    run = client.get_run(parent.run_id)
    assert not [t for t in run.data.tags if t.startswith("best")] and "best/train/loss" not in run.data.metrics
    board = json.loads((tmp_path / "leaderboard.json").read_text())   # json.loads accepts NaN: check the text
    assert [r["metric"] for r in board] == [None, None, None] and "NaN" not in (tmp_path / "leaderboard.json").read_text()
