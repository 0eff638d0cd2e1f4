"""``python -m orchard runs list|show|compare`` (orchard/cli/runs.py): a real sqlite store whose runs
are made with MLflow's client as orchard tags them, then the README's own flower run; a bad
argument is one line naming the key, exit 2, and no store is made where there is none."""
from __future__ import annotations

import time

import pytest

from orchard.cli.runs import runs_command


def _store(tmp_path):
    """A store with three runs of two workloads, the way orchard records them: finished, failed, killed."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from orchard.tracking.store import check_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("flower")
    ids, start = {}, int(time.time() * 1000)
    made = (("good", "flower", "FINISHED", "0.01", 0.5), ("bad", "flower", "FAILED", "0.5", None),
            ("other", "forest", "KILLED", "0.01", None))
    for i, (name, workload, status, lr, mae) in enumerate(made):
        tags = {"orchard.workload": workload, "orchard.strategy": "ring",
                "mlflow.note.content": f"**{workload}** ring · {name} run"}  # markdown, as summary.description writes it
        run_id = client.create_run(exp, start_time=start + i, run_name=name, tags=tags).info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric("train/loss", 1.0, now, 0), Metric("system/cpu_pct_mean", 50.0, now, 0)]
        if mae is not None:
            metrics += [Metric("headline/count_mae", mae, now, 0), Metric("test/mae", mae, now, 0)]
        client.log_batch(run_id, metrics=metrics, params=[Param("flower.lr", lr), Param("flower.epochs", "2"),
                                                          Param("output_dir", str(tmp_path / name))])
        if status == "FAILED":
            client.set_tag(run_id, "orchard.error", "ValueError: loss is nan\nmore lines")
        client.set_terminated(run_id, status)
        ids[name] = run_id
    return uri, ids


def test_list_shows_finished_failed_and_killed_runs_newest_first_and_filters_them(tmp_path, capsys):
    uri, ids = _store(tmp_path)
    assert runs_command(["list", f"tracking.uri={uri}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["run", "status", "workload", "headline"]
    assert [line.split()[0] for line in lines[1:]] == [ids["other"], ids["bad"], ids["good"]]
    good = next(line for line in lines if line.startswith(ids["good"]))
    assert "FINISHED" in good and "flower/ring" in good and "count_mae 0.5" in good and good.endswith("good")
    assert runs_command(["list", "workload=flower", "status=failed", f"tracking.uri={uri}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [ids["bad"]]
    assert runs_command(["list", "limit=1", f"tracking.uri={uri}"]) == 0
    out = capsys.readouterr().out
    assert ids["other"] in out and ids["good"] not in out and "2 older run(s) not shown" in out
    assert runs_command(["list", "workload=video", f"tracking.uri={uri}"]) == 0
    assert capsys.readouterr().out.startswith(f"orchard: no video runs in {uri}")


def test_show_prints_one_run_again_by_a_prefix_of_its_id(tmp_path, capsys):
    uri, ids = _store(tmp_path)
    assert runs_command(["show", ids["bad"][:8], f"tracking.uri={uri}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("orchard flower/ring: bad  FAILED in ")
    assert "\n  flower ring · bad run\n" in out  # the description without the UI's markdown
    assert "error:     ValueError: loss is nan" in out and "more lines" not in out
    assert "train/loss" in out and "system/cpu_pct_mean" not in out and "(1 more in the MLflow UI)" in out
    assert f"python -m orchard ui {ids['bad'][:8]} tracking.uri=" in out


def test_compare_puts_the_runs_side_by_side_with_the_parameters_that_differ(tmp_path, capsys):
    uri, ids = _store(tmp_path)
    assert runs_command(["compare", ids["good"], ids["bad"], f"tracking.uri={uri}"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["status"] == ["FINISHED", "FAILED"]
    assert rows["flower.lr"] == ["0.01", "0.5"]
    assert "flower.epochs" not in rows and "output_dir" not in rows  # the same / says nothing about training
    assert rows["headline/count_mae"] == ["0.5", "-"] and "system/cpu_pct_mean" not in rows
    assert runs_command(["compare", ids["good"], ids["bad"], "metrics=all", f"tracking.uri={uri}"]) == 0
    assert "system/cpu_pct_mean" in capsys.readouterr().out


@pytest.mark.parametrize("argv, key", [
    (["list", "status=DONE"], "status"),
    (["list", "limit=few"], "limit"),
    (["list", "colour=red"], "colour"),
    (["show"], "run id"),
    (["compare", "abcdef12"], "run id"),
    (["compare", "a", "b", "metrics=some"], "metrics"),
    (["tail"], "usage"),
])
def test_a_bad_argument_is_one_line_naming_it_and_exit_2(tmp_path, capsys, argv, key):
    uri, _ = _store(tmp_path)
    assert runs_command([*argv, f"tracking.uri={uri}"]) == 2
    err = capsys.readouterr().err
    assert key in err.splitlines()[0], err


def test_a_store_that_is_not_there_is_named_and_not_made(tmp_path, capsys):
    missing = tmp_path / "nowhere.db"
    assert runs_command(["list", f"tracking.uri=sqlite:///{missing}"]) == 2
    assert "nowhere.db" in capsys.readouterr().err and not missing.exists()


@pytest.mark.slow
def test_the_readme_flower_run_is_listed_and_shown(cli_run, capsys):
    """The README's first command, as typed, then `runs list` and `runs show` on its store."""
    run = cli_run("workload=flower", "strategy=ring")
    assert runs_command(["list", "workload=flower", f"tracking.uri={run.uri}"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(run.run_id))
    assert "FINISHED" in line and "flower/ring" in line and "count_mae" in line
    assert runs_command(["show", run.run_id[:10], f"tracking.uri={run.uri}"]) == 0
    out = capsys.readouterr().out
    assert "count MAE: CNN" in out and "test/mae" in out and str(run.run_dir) in out
