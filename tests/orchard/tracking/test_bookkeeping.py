"""Bookkeeping counters are no charts (issue 52): the MLflow UI opens a run's charts on the
alphabetically first prefix, so ``cache/``, ``cluster/``, ``train/workers`` and the node-loss
figures of a run where nothing happened go to ``tables/bookkeeping.json``, and the node-loss
figures become charts the moment something does. A real sqlite MLflow store read back with
MlflowClient; the session's Ray."""
import pytest
from mlflow.entities import Metric

from orchard.tracking import bookkeeping


def _new_run(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("book", artifact_location=(tmp_path / "artifacts").as_uri())
    return uri, client, client.create_run(experiment).info.run_id


# what the four workloads and the core log that is bookkeeping (grep log_metrics in orchard/, workloads/)
LOGGED_AS_BOOKKEEPING = ["cache/tiles_hits", "cache/evicted_bytes", "cache/hit_rate", "cache/index_pruned",
                         "train/workers", "cluster/nodes_lost", "cluster/nodes_joined", "train/restarts",
                         "train/lost_s", "train/group_workers", "data/train_images", "data/index_reused",
                         "data/train_samples", "data/skipped_files", "data/skipped_files/truncated",
                         "data/skipped_pairs"]
CHARTS = ["train/loss", "val/mae", "test/mae", "headline/count_mae", "time/comm_wait_s", "time/total_s",
          "time/split/steps_s", "throughput/effective_parallelism", "train/shuffle_bytes",
          "train/resumed_from_epoch", "pipeline/spatial_trainer_wait_fraction_mean", "wire/bytes_per_step"]


@pytest.mark.parametrize("key", LOGGED_AS_BOOKKEEPING)
def test_each_bookkeeping_series_is_named_so(key):
    assert bookkeeping.is_bookkeeping(key)


@pytest.mark.parametrize("key", CHARTS)
def test_what_users_compare_and_the_checks_read_stays_a_metric(key):
    assert not bookkeeping.is_bookkeeping(key)


def test_an_event_series_is_held_while_quiet_and_written_whole_once_something_happens():
    ledger = bookkeeping.Ledger()
    assert ledger.route(Metric("train/group_workers", 2, 1000, 1)) == []      # the group's first start
    assert ledger.route(Metric("cluster/nodes_lost", 0, 1001, 0)) == []
    moved = ledger.route(Metric("train/group_workers", 1, 2000, 2))            # it started again, smaller
    assert [(m.value, m.timestamp, m.step) for m in moved] == [(2, 1000, 1), (1, 2000, 2)]
    assert ledger.route(Metric("train/group_workers", 2, 3000, 3))[0].value == 2   # a chart from now on
    assert ledger.snapshot() == {"cluster/nodes_lost": 0, "train/group_workers": 2}


def test_a_skip_count_is_bookkeeping_at_zero_and_a_chart_once_a_file_was_skipped():
    ledger = bookkeeping.Ledger()
    assert ledger.route(Metric("data/skipped_files", 0, 1000, 0)) == []
    assert ledger.route(Metric("data/train_images", 40, 1000, 0)) == []          # a size: never a chart
    moved = ledger.route(Metric("data/skipped_files", 2, 2000, 1))
    assert [(m.value, m.step) for m in moved] == [(0, 0), (2, 1)]
    assert [m.value for m in ledger.route(Metric("data/skipped_files/truncated", 2, 2000, 1))] == [2]
    assert ledger.snapshot() == {"data/skipped_files": 2, "data/skipped_files/truncated": 2, "data/train_images": 40}


def test_chart_sections_follow_the_ui_headline_before_learning_system_last():
    keys = ["train/loss", "system/node0/cpu_pct", "headline/count_mae", "time/split/steps_s", "wire/bytes_per_step",
            "val/mae", "epoch", "test/mae"]
    assert bookkeeping.chart_sections(keys) == ["headline", "test", "time/split", "train", "val", "wire",
                                                "Model metrics", "System metrics"]


@pytest.mark.slow
def test_the_sink_keeps_bookkeeping_out_of_the_charts_and_in_its_artifact(ray_session, tmp_path):
    import ray

    from orchard.tracking.sink import MetricsSink

    uri, client, run_id = _new_run(tmp_path)
    sink = MetricsSink.remote(uri, run_id, 0.2)
    ray.get(sink.log_metrics.remote({"cache/tiles_hits": 1.0, "train/loss": 0.5, "cluster/nodes_lost": 0.0}, 0, 1000))
    ray.get(sink.log_metrics.remote({"train/group_workers": 2.0}, 1, 1001))
    ray.get(sink.flush.remote())
    assert set(client.get_run(run_id).data.metrics) == {"train/loss"}
    assert bookkeeping.read(client, run_id) == {"cache/tiles_hits": 1.0, "cluster/nodes_lost": 0.0,
                                                "train/group_workers": 2.0}
    # a node lost: the count is a chart from its first point on, and the counter goes on
    ray.get(sink.log_metrics.remote({"cluster/nodes_lost": 1.0}, 2, 2000))
    ray.get(sink.log_final.remote({"train/workers": 2.0, "test/mae": 0.4}, 3000))
    last = ray.get(sink.last_values.remote())   # what the end-of-run summary reads: all of it
    ray.get(sink.close.remote(), timeout=120)
    ray.kill(sink)
    metrics = client.get_run(run_id).data.metrics
    assert not [k for k in metrics if bookkeeping.is_bookkeeping(k) and k != "cluster/nodes_lost"]
    assert [(h.step, h.value) for h in client.get_metric_history(run_id, "cluster/nodes_lost")] == [(0, 0.0), (2, 1.0)]
    book = bookkeeping.read(client, run_id)
    assert book["cluster/nodes_lost"] == 1.0 and book["train/workers"] == 2.0 and "test/mae" not in book
    assert last["cache/tiles_hits"] == 1.0 and last["train/workers"] == 2.0 and last["test/mae"] == 0.4


def test_a_runs_charts_open_on_the_headline_once_the_events_that_happened_are_passed():
    """Skip counts lead where files were skipped (a warning first); what follows is the headline."""
    skipped = bookkeeping.chart_sections(["data/skipped_files", "data/skipped_files/decode", "headline/top1", "test/top1"])
    assert skipped[:2] == ["data", "data/skipped_files"] and bookkeeping.opening_section(skipped) == "headline"
    assert bookkeeping.opening_section(["headline", "test"]) == "headline"
    assert bookkeeping.opening_section(["cache", "headline"]) == "cache"   # bookkeeping is no event
