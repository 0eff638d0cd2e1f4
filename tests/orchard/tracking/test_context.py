"""orchard/tracking/context.py on its own: what a workload's ``RunContext`` does with each call
(metrics from the driver and from a Ray task, artifacts under their folder in a real sqlite store
read back with MlflowClient, a throttled progress line), that it travels without the driver's
hooks, and which metric names it stops before they leave the process. The run's real
``MetricsSink`` on the session's Ray; the name rules without Ray. (A bad name's characters and
path and the plain-name fast path: test_sink.py.)"""
import json
import pickle

import numpy as np
import pytest

from orchard.tracking import context
from orchard.tracking.context import RunContext


@pytest.fixture
def run(ray_session, tmp_path):
    """``(ctx, client)``: a RunContext on a new run of a new store in tmp_path, with its sink."""
    from mlflow.tracking import MlflowClient

    from orchard.tracking.sink import MetricsSink
    from orchard.tracking.store import check_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("ctx", (tmp_path / "art").as_uri())).info.run_id
    sink = MetricsSink.remote(uri, run_id, 3600.0)   # written by flush() only
    yield RunContext(sink, run_id, str(tmp_path), "tiny", "tasks", tracking_uri=uri), client
    ray_session.kill(sink)


@pytest.mark.slow
def test_metrics_from_a_ray_task_and_the_driver_reach_the_run_and_the_driver_hook_sees_its_own(run, ray_session):
    """A sweep trial's driver hook (``_on_metrics``) gets the driver's values as floats, without the
    ``None`` a loop may log for a figure it has not got yet; a task's copy of the context has no hook."""
    ctx, client = run
    seen = []
    ctx._on_metrics = lambda metrics, step: seen.append((metrics, step))

    @ray_session.remote(num_cpus=0)
    def worker_step(ctx):
        ctx.log_metrics({"worker/loss": 2}, step=3)
        ctx.flush()   # a caller's flush orders its own messages, not another process's
        return ctx._on_metrics is None

    assert ray_session.get(worker_step.remote(ctx))
    ctx.log_metrics({"train/loss": np.float32(0.5), "val/acc": None}, step=3)
    ctx.flush()
    assert seen == [({"train/loss": 0.5}, 3)]
    assert client.get_run(ctx.run_id).data.metrics == {"worker/loss": 2.0, "train/loss": 0.5}


@pytest.mark.slow
def test_a_drawing_runs_in_a_ray_task_logs_its_figure_and_returns_what_it_drew(run):
    """``draw``: the function runs in another process with the run's context; once ``result()``
    returned, its PNG is in the store (the task flushed its own messages) and its value is back;
    an error is the function's own, raised where it is waited for, and again by the run's wait."""
    import os

    from tests.tiny_workload import draw_line

    ctx, client = run
    drawn = ctx.draw(draw_line, points=[1.0, 2.5], fail=False)
    assert drawn.result() == 3.5
    (png,) = [a.path for a in client.list_artifacts(ctx.run_id, "figures")]
    local = client.download_artifacts(ctx.run_id, png)
    assert png == "figures/drawn.png" and open(local, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    where = ctx.draw(lambda c: os.getpid())
    assert where.result() != os.getpid()
    failed = ctx.draw(draw_line, points=[], fail=True)
    with pytest.raises(ValueError, match="asked to fail"):
        failed.result()
    with pytest.raises(ValueError, match="asked to fail"):
        ctx.wait_for_drawings()
    ctx.wait_for_drawings()  # each drawing is waited for once
    assert pickle.loads(pickle.dumps(ctx))._drawings == []  # a task's copy carries none


@pytest.mark.slow
def test_artifacts_land_in_the_run_under_the_folder_named(run, tmp_path):
    ctx, client = run
    (tmp_path / "notes.txt").write_text("hello")
    ctx.log_artifact(tmp_path / "notes.txt", "reports/")
    ctx.log_text("plain", "top.txt")
    ctx.log_dict({"count": np.int64(3), "mean": np.float32(0.25), "sizes": np.arange(2), "path": tmp_path}, "stats/s.json")
    ctx.flush()   # after the artifacts on the sink's one writer: they are in the store
    listed = {a.path for a in client.list_artifacts(ctx.run_id)} | {a.path for a in client.list_artifacts(ctx.run_id, "reports")}
    assert {"reports/notes.txt", "top.txt", "stats"} <= listed
    stats = json.loads(open(client.download_artifacts(ctx.run_id, "stats/s.json", str(tmp_path / "dl"))).read())
    assert stats == {"count": 3, "mean": 0.25, "sizes": [0, 1], "path": str(tmp_path)}   # numpy as JSON, the rest as text


@pytest.mark.slow
def test_progress_is_sent_at_most_once_an_interval_but_always_the_last_step(run, ray_session, monkeypatch):
    ctx, _ = run
    # longer than any machine has been up: the first message is sent all the same (it was dropped
    # while time.monotonic(), the time since boot, was below the interval: a fresh CI machine)
    monkeypatch.setattr(context, "PROGRESS_INTERVAL_S", 1e9)

    def shown():
        ctx.flush()   # the progress messages before it are handled
        return ray_session.get(ctx._sink.get_progress.remote())

    ctx.progress(1, 10, desc="epoch 1/2", **{"img/s": 5.0})
    assert (shown()["step"], shown()["rates"]) == (1, {"img/s": 5.0})
    ctx.progress(2, 10)
    assert shown()["step"] == 1   # within the interval: dropped, the loop paid no actor call
    ctx.progress(10, 10)
    assert shown()["step"] == 10


def test_a_context_pickles_without_the_drivers_hook_and_with_its_own_throttle():
    ctx = RunContext(None, "r1", "/runs/r1", "tiny", "ring", tracking_uri="sqlite:///m.db", storage="s3://b/r1")
    ctx._on_metrics = lambda metrics, step: None   # a closure that could not be pickled
    ctx._progress_sent = 123.0
    copy = pickle.loads(pickle.dumps(ctx))
    assert copy._on_metrics is None and copy._progress_sent == float("-inf")
    assert (copy.run_id, str(copy.run_dir), copy.workload, copy.strategy, copy.tracking_uri, copy.storage) == \
        ("r1", "/runs/r1", "tiny", "ring", "sqlite:///m.db", "s3://b/r1")
    assert ctx._on_metrics is not None   # the driver's own keeps it


@pytest.mark.parametrize("key, why", [
    (3, "metric name 3 is refused by MLflow: a name must be a string, not int"),
    ("a" * 251, "a name has at most 250 characters; this one has 251"),
])
def test_a_name_mlflow_would_refuse_for_its_type_or_length_is_stopped_with_why(key, why):
    with pytest.raises(ValueError) as err:
        context.check_metric_name(key)
    assert str(err.value).endswith(why) and "\n" not in str(err.value)


def test_a_long_refused_name_is_quoted_cut_to_a_readable_length():
    with pytest.raises(ValueError) as err:
        context.check_metric_name("val/" + "x" * 200 + " (%)")
    quoted = str(err.value).split(" is refused")[0][len("metric name "):]
    assert len(quoted) == 80 and quoted.startswith("'val/xxx") and quoted.endswith("...'")
