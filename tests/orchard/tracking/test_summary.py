"""orchard/tracking/summary.py on its own: how figures read, what the summary leaves out, the run's
description (secrets masked) and the headline appended to it on a real sqlite store read back with
MlflowClient. The summary's layout with the workloads' headlines: test_progress.py. No Ray."""
import types

import pytest
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from orchard.tracking import summary
from orchard.tracking.store import check_store

CFG = {"workload": {"name": "tiny"}, "strategy": {"name": "tasks"}, "mode": "train",
       "_overrides": ["workload=tiny", "tiny.lr=0.05"]}


@pytest.fixture
def client(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)  # a new store as orchard makes one (a copy of an empty, migrated one)
    return MlflowClient(uri)


@pytest.mark.parametrize("value, shown", [(1234.4, "1,234"), (0.000123456, "0.0001235"), (3.0, "3"), ("n/a", "n/a")])
def test_a_figure_reads_with_four_significant_digits(value, shown):
    assert summary.num(value) == shown


def test_a_figure_of_ten_thousand_or_more_reads_thousands_separated():
    assert summary.num(123456.0) == "123,456" and summary.num(12345) == "12,345"


def test_a_headline_that_fails_on_a_failed_runs_metrics_falls_back_to_four_held_out_results():
    def headline(cfg, metrics):
        return [f"accuracy {metrics['test/accuracy']}"]   # a failed run lacks it

    module = types.SimpleNamespace(headline=headline)
    metrics = {f"val/m{i}": float(i) for i in range(6)} | {"train/loss": 0.1, "test/note": "text"}
    assert summary.headline(module, {}, metrics) == ["val/m0 0", "val/m1 1", "val/m2 2", "val/m3 3"]


def test_the_summary_leaves_out_what_the_run_did_not_measure():
    assert summary.render("orchard tiny/tasks: r  FINISHED", ["loss 0.1"], {"train/loss": 0.1}, ["view: x"]) == \
        "orchard tiny/tasks: r  FINISHED\n  loss 0.1\nview: x"
    times = {"time/to_target_s": 1.0, "time/data_s": 0.5, "time/train_s": 2.0, "time/prepare_s": 0.1, "time/total_s": 3.0}
    text = summary.render("t", [], times, [])
    assert text.splitlines()[1] == "time:      total 3.0 s, train 2.0 s, data 0.5 s, prepare 0.1 s"  # four, in TIME order


def test_a_predict_run_counts_a_file_set_aside_before_and_during_prediction_once():
    """A file the listing set aside (data/skipped_files) is also among the predict rows' skipped:
    the larger count is the run's, not their sum."""
    metrics = {"predict/images": 3.0, "predict/images_per_s": 1.5, "predict/skipped": 1.0, "data/skipped_files": 2.0}
    assert summary.predicted(metrics) == ["predicted: 3 images (1.5 images/s), 2 skipped (skipped.csv says why)"]
    assert summary.predicted({"predict/images": 3.0}) == []   # no rate: no predict run's answer


def test_a_runs_description_masks_a_secret_and_leaves_out_where_the_run_is_kept():
    cfg = {**CFG, "_overrides": ["workload=tiny", "+cluster.runtime_env.env_vars.HF_TOKEN=hf_abc",
                                 "storage.uri=s3://k:secret@bucket/p", "~tiny.sleep_s", "tiny.lr=0.05"]}
    assert summary.description(cfg) == "**tiny** tasks · +cluster.runtime_env.env_vars.HF_TOKEN=*** ~tiny.sleep_s tiny.lr=0.05"


def test_the_headline_is_appended_to_the_runs_description_in_the_ui(client):
    module = types.SimpleNamespace(headline=lambda cfg, metrics: [f"loss {metrics['train/loss']}", "second line"])
    described = client.create_run(client.create_experiment("a"), tags={MLFLOW_RUN_NOTE: "my run"}).info.run_id
    summary.note_result(client, described, module, CFG, {"train/loss": 0.25})
    assert client.get_run(described).data.tags[MLFLOW_RUN_NOTE] == "my run → loss 0.25"
    bare = client.create_run(client.create_experiment("b")).info.run_id   # opened without one: the config's
    summary.note_result(client, bare, module, CFG, {"train/loss": 0.5})
    assert client.get_run(bare).data.tags[MLFLOW_RUN_NOTE] == "**tiny** tasks · tiny.lr=0.05 → loss 0.5"


def test_a_run_without_a_headline_keeps_its_description_as_it_was(client):
    run = client.create_run(client.create_experiment("c"), tags={MLFLOW_RUN_NOTE: "my run"}).info.run_id
    summary.note_result(client, run, types.SimpleNamespace(), CFG, {"train/loss": 0.25})
    assert client.get_run(run).data.tags[MLFLOW_RUN_NOTE] == "my run"
