"""A run of the tests' workload lands in MLflow with params, metrics from the driver and from
a Ray task, the config artifact, per-node resource series and their summaries, and a status
that matches what happened (the store itself: tracking/test_store.py)."""
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.session_ray import attach_overrides
from tests.tiny_workload.cli import tiny_cli, tiny_cli_env


@pytest.mark.slow
def test_finished_run_holds_everything(run_orchard):
    res = run_orchard("workload=tiny", "tiny.steps=30", "tracking.sample_interval_s=0.2")
    assert res.exit_code == 0
    run = res.run
    assert run.info.status == "FINISHED"
    assert run.data.params["tiny.steps"] == "30" and run.data.params["strategy.name"] == "tasks"
    tags = run.data.tags
    assert tags["orchard.workload"] == "tiny" and tags["ray.version"] and tags["torch.version"]
    assert "mlflow.source.git.commit" in tags
    assert tags["orchard.mlflow_version"] and "mlflow.version" not in tags   # mlflow.* is MLflow's own
    # metrics from the driver and from a Ray task, every step
    assert len(res.history("train/loss")) == 30
    assert len(res.history("worker/loss")) == 30
    assert res.history("train/loss")[-1] < res.history("train/loss")[0]
    assert run.data.metrics["train/final_loss"] == pytest.approx(res.metrics["train/final_loss"])
    assert run.data.metrics["time/total_s"] > 0
    # per-node resource series and run-level summaries
    assert len(res.history("system/node0/cpu_pct")) >= 1
    for key in ("system/cpu_pct_mean", "system/cpu_pct_std", "system/node0/mem_pct_mean"):
        assert key in run.data.metrics
    arts = res.artifacts()
    assert "config.yaml" in arts and "figures" in arts and "notes" in arts
    assert res.artifacts("figures") == ["figures/loss.png"]
    cfg_text = Path(res.client.download_artifacts(run.info.run_id, "config.yaml")).read_text()
    assert "tiny:" in cfg_text and "steps: 30" in cfg_text


@pytest.mark.slow
def test_final_metrics_land_at_the_last_step_not_back_at_zero(run_orchard):
    res = run_orchard("workload=tiny", "tiny.steps=12", "tracking.sample_interval_s=0.2")
    (final,) = res.client.get_metric_history(res.run.info.run_id, "train/final_loss")
    (total,) = res.client.get_metric_history(res.run.info.run_id, "time/total_s")
    assert final.step == total.step == 11  # the run's last training step, whatever the samplers counted
    # a key whose per-step series already ends on the final value is not logged once more
    assert len(res.history("train/loss")) == 12


@pytest.mark.slow
def test_failing_workload_leaves_a_failed_run_with_the_reason(run_orchard, capsys):
    res = run_orchard("workload=tiny", "tiny.fail=true")
    assert res.exit_code == 1
    assert res.run.info.status == "FAILED"
    assert "asked to fail" in res.run.data.tags["orchard.error"]
    assert "error.txt" in res.artifacts()
    assert "tiny failed: RuntimeError" in capsys.readouterr().err


@pytest.mark.slow
def test_a_figure_drawn_in_a_task_the_workload_never_waited_for_is_in_the_finished_run(run_orchard):
    """``ctx.draw`` goes on in a Ray task; the run waits for it as the workload returns."""
    res = run_orchard("workload=tiny", "tiny.draw=left", "tiny.steps=5")
    assert res.exit_code == 0 and res.run.info.status == "FINISHED"
    assert "figures/drawn.png" in res.artifacts("figures")


@pytest.mark.slow
def test_a_drawing_that_fails_fails_the_run_with_its_own_error(run_orchard, capsys):
    res = run_orchard("workload=tiny", "tiny.draw=fail", "tiny.steps=5")
    assert res.exit_code == 1 and res.run.info.status == "FAILED"
    assert "tiny drawing asked to fail" in res.run.data.tags["orchard.error"]
    assert "ValueError" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_data_found_inside_the_run_is_exit_2_with_the_run_failed(run_orchard, capsys):
    res = run_orchard("workload=tiny", "tiny.bad_data=true")
    assert res.exit_code == 2 and res.run.info.status == "FAILED"
    assert "usable sample" in res.run.data.tags["orchard.error"]
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("orchard:")]
    assert err == [f"orchard: bad config: tiny.data_dir: a folder with at least one usable sample; none was "
                   f"(tiny.bad_data=true) (run {res.run.info.run_id} marked FAILED)"]


def test_a_refusal_of_the_workloads_check_while_ray_starts_is_exit_2_and_opens_no_run(run_orchard, capsys):
    """``check`` (what needs the workload's heavy libraries) runs in a thread while Ray starts: its
    ConfigError is the same one line and exit 2 as ``validate``'s, and no MLflow run is opened."""
    res = run_orchard("workload=tiny", "tiny.check_fails=true")
    assert res.exit_code == 2 and res.run is None
    assert res.client.search_runs([e.experiment_id for e in res.client.search_experiments()],
                                  "params.`tiny.check_fails` = 'True'") == []
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("orchard:")]
    assert err == ["orchard: bad config: tiny.check_fails: false (the workload's check refused it, "
                   "tiny.check_fails=true)"]


@pytest.mark.slow
def test_tracking_none_records_nothing_but_returns_metrics(run_orchard):
    res = run_orchard("workload=tiny", "tracking=none", "tiny.steps=5")
    assert res.exit_code == 0 and res.run is None
    assert "train/final_loss" in res.metrics


@pytest.mark.slow
def test_ctrl_c_marks_the_run_killed(ray_session, tmp_path):
    """A real SIGINT to a real CLI process: exit 130 and a KILLED run."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.Popen(tiny_cli("workload=tiny", "tiny.steps=400", "tiny.sleep_s=0.05",
                             f"tracking.uri={uri}", f"output_dir={tmp_path}/out", *attach_overrides()),
                            cwd=tmp_path, env=tiny_cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until the run is really training
        time.sleep(1)
        try:  # a watcher like this one may race the run to create the store: both must live through it
            client = MlflowClient(uri)
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        except Exception:
            continue
        if runs and client.get_metric_history(runs[0].info.run_id, "train/loss"):
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    run = client.get_run(runs[0].info.run_id)
    assert run.info.status == "KILLED"


@pytest.mark.slow
def test_metrics_sink_killed_mid_run_is_restarted_and_the_run_finishes(run_orchard):
    """The sink dies twice while flower's Train workers log through it: Ray restarts it, the calls
    in flight are resent, and the run ends FINISHED with its metrics (the unflushed batch, at
    most tracking.flush_interval_s of metrics, may be lost)."""
    import threading

    import ray

    kills: list[int] = []
    stop = threading.Event()

    def killer():
        # kill mid-epoch: once the workers' step reports reach the sink, and again two steps on
        while not stop.is_set() and len(kills) < 2:
            names = [n for n in ray.util.list_named_actors() if n.startswith("orchard-sink-")]
            try:
                sink = ray.get_actor(names[0]) if names else None
                step = ray.get(sink.get_progress.remote(), timeout=10).get("step", 0) if sink else 0
            except Exception:  # restarting, or the run is over
                step = 0
            if step >= (kills[-1] + 2 if kills else 1):
                ray.kill(sink, no_restart=False)
                kills.append(step)
            stop.wait(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        # ~10 steps an epoch: both kills land in the first two or three epochs, the rest is margin
        res = run_orchard("workload=flower", "strategy=ring", "debug=smoke", "flower.epochs=8")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert kills, "the sink was never killed: the run ended before the first kill"
    assert res.exit_code == 0, res.outcome.error
    assert res.run.info.status == "FINISHED"
    assert "test/mae" in res.run.data.metrics and res.history("train/loss")
