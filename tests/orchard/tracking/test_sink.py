"""The metrics sink under a store that refuses: one bad metric is dropped alone and counted,
the buffer is bounded with a count, and ``ctx.log_metrics`` stops a bad name where it is logged.
A real sqlite MLflow store in tmp_path, read back with MlflowClient; the session's Ray."""
import time

import pytest


def _new_run(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    return uri, client, client.create_run(client.create_experiment("sink")).info.run_id


@pytest.mark.slow
def test_a_bad_metric_name_mid_run_is_dropped_alone_and_the_final_metrics_arrive(ray_session, tmp_path):
    """MLflow refuses a whole log_batch for one bad name: the sink writes the rest of the batch,
    every later step and the final metrics, and counts what it dropped in sink/dropped_metrics."""
    import ray

    from orchard.tracking.sink import DROPPED, MetricsSink

    uri, client, run_id = _new_run(tmp_path)
    sink = MetricsSink.remote(uri, run_id, 0.2)
    for step in range(10):
        metrics = {"train/loss": 1.0 / (step + 1)}
        if step == 4:  # sent straight to the sink, as the core sends a workload's returned metrics
            metrics["bad key!"] = 1.0
        ray.get(sink.log_metrics.remote(metrics, step, 1000 + step))
    ray.get(sink.log_final.remote({"test/mae": 0.5, "val/bad metric?": 2.0}, 2000))
    ray.get(sink.close.remote(), timeout=120)
    ray.kill(sink)

    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == list(range(10))
    metrics = client.get_run(run_id).data.metrics
    assert metrics["test/mae"] == 0.5
    assert metrics[DROPPED] == 2
    assert "bad key!" not in metrics and "val/bad metric?" not in metrics


@pytest.mark.slow
def test_after_a_restart_the_backlog_is_written_at_once_so_a_second_kill_loses_none_of_it(ray_session, tmp_path):
    """The calls that queued while the sink restarted arrive at once (a whole run's, when training
    outran a slow restart); a second kill right after them must not find them all in the buffer.
    Before a restart the sink buffers as usual (no timer flush here: an hour's interval)."""
    import ray

    from orchard.tracking.sink import MetricsSink

    uri, client, run_id = _new_run(tmp_path)
    sink = MetricsSink.remote(uri, run_id, 3600.0)
    ray.get(sink.log_metrics.remote({"train/loss": 9.0}, 0, 1000))
    ray.get(sink.progress.remote({"step": 1}))
    assert client.get_metric_history(run_id, "train/loss") == []   # buffered, not written through
    ray.kill(sink, no_restart=False)                                # lost with the buffer: documented
    while ray.get(sink.get_progress.remote(), timeout=120):        # a kill lands late: wait for the new one
        time.sleep(0.05)
    for step in range(1, 6):  # the restarted sink takes the backlog
        ray.get(sink.log_metrics.remote({"train/loss": float(step)}, step, 1000 + step))
    ray.kill(sink, no_restart=False)                                # the second kill, no flush before it
    ray.get(sink.ping.remote(), timeout=120)
    ray.kill(sink)
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_the_buffer_is_bounded_and_what_it_spills_is_counted(ray_session, tmp_path):
    """More metrics than ``max_pending`` before a flush: the oldest go, the newest and the count
    (sink/spilled_metrics) reach the store."""
    import ray

    from orchard.tracking.sink import SPILLED, MetricsSink

    uri, client, run_id = _new_run(tmp_path)
    sink = MetricsSink.remote(uri, run_id, 3600.0, max_pending=10)  # no timer flush: close() is the first
    for step in range(25):
        ray.get(sink.log_metrics.remote({"train/loss": float(step)}, step, 1000 + step))
    ray.get(sink.close.remote(), timeout=120)
    ray.kill(sink)

    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == list(range(15, 25))
    assert client.get_run(run_id).data.metrics[SPILLED] == 15


@pytest.mark.slow
def test_log_metrics_refuses_a_bad_name_with_one_line_naming_it_and_sends_nothing(ray_session):
    from orchard.tracking.context import RunContext
    from orchard.tracking.sink import MetricsSink

    sink = MetricsSink.remote(None, None)
    ctx = RunContext(sink, None, "/tmp", "tiny", "tasks")
    with pytest.raises(ValueError) as err:
        ctx.log_metrics({"train/loss": 1.0, "val/acc (%)": 2.0}, step=0)
    message = str(err.value)
    assert "'val/acc (%)'" in message and "Names may only contain" in message and "\n" not in message
    with pytest.raises(ValueError, match="'train//loss'"):  # MLflow's path rule: it would read as 'train/loss'
        ctx.log_metrics({"train//loss": 1.0})
    ctx.log_metrics({"train/loss": 3.0, "time/epoch_s": 0.5}, step=1)
    ctx.flush()  # in order after the calls before it
    assert ctx.last_values() == {"train/loss": 3.0, "time/epoch_s": 0.5}  # the refused calls sent nothing


def test_plain_names_pass_without_loading_mlflow_and_only_names_mlflow_accepts_do():
    """A Train worker's first ``ctx.log_metrics`` must not import mlflow (1.7 s) for a plain name;
    the fast path accepts nothing MLflow's own rules refuse, and hands everything else to them."""
    import subprocess
    import sys

    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, path_not_unique, validate_param_and_metric_name

    from orchard.tracking.context import _PLAIN_MAX, _plainly_valid

    code = ("import sys; from orchard.tracking.context import check_metric_name; "
            "check_metric_name('train/loss'); check_metric_name('throughput/w1_images_per_s'); "
            "print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    assert _PLAIN_MAX == MAX_ENTITY_KEY_LENGTH
    names = ["train/loss", "a b", "x.y-z_1", "train//loss", "./a", "../a", "/a", "a/", "a/./b", ".", "..",
             "val/acc (%)", "t:1", "é", "a" * 250, "a" * 251, "", " ", "a/.b"]
    for name in names:
        if _plainly_valid(name):
            assert validate_param_and_metric_name(name) and not path_not_unique(name) \
                and len(name) <= MAX_ENTITY_KEY_LENGTH, name


@pytest.mark.slow
def test_the_in_memory_series_are_bounded_and_keep_the_runs_summary_and_the_pollers_place(ray_session):
    """A long run's resource series and a sweep's watched metric hold at most ``max_series`` points
    in the sink: the resource series is thinned (its mean stays the run's), the watched metric
    drops its oldest points and a poller that has read them all goes on where it was."""
    import ray

    from orchard.tracking.sink import MetricsSink

    sink = MetricsSink.remote(None, None, 3600.0, max_series=8, watch=("val/loss",))
    for step in range(100):
        ray.get(sink.log_metrics.remote({"system/node0/cpu_pct": float(step % 10)}, step, step, keep_series=True))
        ray.get(sink.log_metrics.remote({"val/loss": float(step)}, step, step))
    series = ray.get(sink.series.remote("system/"))["system/node0/cpu_pct"]
    watched = ray.get(sink.logged_since.remote("val/loss", 95))
    ray.kill(sink)
    assert len(series) <= 8 and set(series) <= set(range(10))
    assert watched == [(s, float(s)) for s in range(95, 100)]   # indices count every point logged


@pytest.mark.slow
def test_a_workload_returning_a_name_mlflow_refuses_finishes_with_the_rest_of_its_final_metrics(run_orchard):
    """A user's workload that builds a metric name from its data: the run still FINISHES, its other
    final metrics arrive, the bad one alone is dropped and counted."""
    from orchard.tracking.sink import DROPPED

    res = run_orchard("workload=tiny", "tiny.steps=5", "tiny.returns_metric=val/bad metric?")
    assert res.exit_code == 0 and res.run.info.status == "FINISHED"
    m = res.run.data.metrics
    assert m[DROPPED] == 1 and "val/bad metric?" not in m
    assert {"train/final_loss", "worker/final_loss", "val/score"} <= set(m)
