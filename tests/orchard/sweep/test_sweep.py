"""Ray Tune sweeps on the tiny test workload: parent + one child run per trial, a leaderboard,
identity by command, ASHA closing the trials it stops, Ctrl-C then resume.  The shipped sweeps
on the real workloads are tests/integration/test_sweeps.py."""
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchard.run.lifecycle import execute, preflight, prepare
from orchard.storage import Storage
from orchard.sweep import seal as sweep_seal
from orchard.tracking.store import check_store
from tests.session_ray import attach_overrides
from tests.tiny_workload.cli import tiny_cli, tiny_cli_env

# smaller grids than tiny_grid's four learning rates: fewer trials, same behaviour
TWO_LRS = "sweep.params={tiny.lr: {type: grid, values: [0.01, 0.3]}}"
THREE_LRS = "sweep.params={tiny.lr: {type: grid, values: [0.01, 0.1, 0.3]}}"


def _sweep_overrides(*extra):
    return ["workload=tiny", "sweep=tiny_grid", *extra]


def _children(client, parent):
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")


@pytest.mark.slow
def test_sweep_gives_parent_children_and_leaderboard(run_orchard, capsys):
    res = run_orchard(*_sweep_overrides("tiny.steps=20", "tracking.system_metrics=false", TWO_LRS))
    assert res.exit_code == 0
    parent = res.run
    assert parent.info.status == "FINISHED"
    children = _children(res.client, parent)
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert sorted(float(c.data.params["tiny.lr"]) for c in children) == [0.01, 0.3]
    best_child = min(children, key=lambda c: c.data.metrics["train/loss"])
    assert parent.data.tags["best_run_id"] == best_child.info.run_id
    assert parent.data.metrics["best/train/loss"] == pytest.approx(best_child.data.metrics["train/loss"])
    out = capsys.readouterr().out
    assert "rank" in out and "tiny.lr" in out and best_child.info.run_id[:12] in out
    # a progress line as each trial starts and ends, with the counts and the best so far
    progress = [line for line in out.splitlines() if line.startswith("orchard: sweep: trial ")]
    assert len(progress) == 4 and "started" in progress[0], progress
    assert "finished; 2/2 done, 0 running, 0 failed; best train/loss " in progress[-1], progress
    board = json.loads(Path(res.client.download_artifacts(parent.info.run_id, "leaderboard.json")).read_text())
    assert len(board) == 2 and board[0]["run_id"] == best_child.info.run_id


@pytest.fixture
def tiny_sweep(ray_session, tracking_uri, tmp_path, capsys):
    """``tiny_sweep(*overrides, lrs=[...]) -> (Outcome, console)``: a tiny sweep in this process over
    the learning rates ``lrs`` (the grid, in this order), on the test store; console: its stdout,
    then its stderr."""

    def _run(*overrides, lrs=(0.1,)):
        cfg, module = prepare(["workload=tiny", "sweep=tiny_grid", "tracking.system_metrics=false", *overrides,
                               f"tracking.uri={tracking_uri}", f"output_dir={tmp_path}/out"])
        cfg["sweep"]["params"]["tiny.lr"]["values"] = list(lrs)
        preflight(cfg)
        outcome = execute(cfg, module)
        printed = capsys.readouterr()
        return outcome, printed.out + printed.err

    return _run


@pytest.mark.slow
def test_same_command_resumes_another_command_starts_a_new_sweep(tiny_sweep, tracking_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    first, out1 = tiny_sweep("tiny.steps=5")
    # a pickle planted beside the saved Tune state (a teammate who can write the bucket): the
    # same command refuses to unpickle any of it, in one line, and touches nothing
    (planted,) = [d / "planted.pkl" for d in (tmp_path / "out" / "sweeps").glob("*/tune")]
    planted.write_bytes(b"cos\nsystem\n(S'touch pwned'\ntR.")
    refused, _ = tiny_sweep("tiny.steps=5")
    assert refused.exit_code == 2 and refused.run_id is None
    assert "did not write: planted.pkl" in refused.error and "does not unpickle" in refused.error, refused.error
    assert MlflowClient(tracking_uri).get_run(first.run_id).info.status == "FINISHED"  # not reopened
    planted.unlink()
    again, out2 = tiny_sweep("tiny.steps=5")
    assert sweep_seal.verify(Storage(planted.parent))  # the resumed session sealed what it wrote too
    other, out3 = tiny_sweep("tiny.steps=6")
    assert first.exit_code == again.exit_code == other.exit_code == 0
    assert "starting" in out1 and "resuming" in out2 and "starting" in out3
    assert again.run_id == first.run_id != other.run_id  # same command, same parent run
    client = MlflowClient(tracking_uri)
    for outcome in (first, other):
        parent = client.get_run(outcome.run_id)
        assert parent.info.status == "FINISHED"
        assert len(_children(client, parent)) == 1  # resuming a finished sweep trains nothing again
    keys = {client.get_run(o.run_id).data.tags["orchard.sweep_key"] for o in (first, other)}
    assert len(keys) == 2


@pytest.mark.slow
def test_asha_stops_a_lagging_trial_on_a_metric_logged_by_a_ray_task(tiny_sweep, tracking_uri):
    """worker/loss is logged from a Ray task, not the trial's own process: the run's sink feeds it
    to ASHA.  One trial at a time, the good one first: the lagging one is cut at the first rung,
    and its MLflow run is closed KILLED with the reason instead of staying RUNNING."""
    from mlflow.tracking import MlflowClient

    outcome, console = tiny_sweep("sweep.scheduler=asha", "sweep.metric=worker/loss", "sweep.max_concurrent_trials=1",
                                  "sweep.asha.grace_period=3", "tiny.steps=40", "tiny.sleep_s=0.1", lrs=(0.3, 0.003))
    client = MlflowClient(tracking_uri)
    parent = client.get_run(outcome.run_id)
    assert outcome.exit_code == 0 and parent.info.status == "FINISHED"
    children = {float(c.data.params["tiny.lr"]): c for c in _children(client, parent)}
    assert children[0.3].info.status == "FINISHED"
    lagging = children[0.003]
    assert lagging.info.status == "KILLED"
    assert "stopped early by the ASHA scheduler" in lagging.data.tags["orchard.error"]
    # Tune killed it before its close copied its log: the sweep's driver kept its part of it, in
    # its run folder and in the run, as the finished trial's close did for that one
    for trial in (children[0.3], lagging):
        kept = Path(trial.data.tags["orchard.run_dir"]) / "orchard.log"
        assert kept.read_text().strip() and "orchard.log" in [a.path for a in client.list_artifacts(trial.info.run_id)], trial.info.status
    board = json.loads(Path(client.download_artifacts(parent.info.run_id, "leaderboard.json")).read_text())
    assert [row["params"]["tiny.lr"] for row in board] == [0.3]  # a trial cut early is not ranked
    # the console says so as it happens
    assert "stopped early by the scheduler; 2/2 done (1 stopped early), 0 running, 0 failed" in console, console[-2000:]


def _one_at_a_time_sweep(tmp_path, *extra):
    """The tiny grid of three learning rates, one trial at a time, slow enough to interrupt, as a
    command line on the test session's Ray: ``(args, env, client, runs(status=None))``."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)  # created once, before this test's client polls it beside the sweep (docs/runs.md)
    args = tiny_cli("workload=tiny", "sweep=tiny_grid", "sweep.max_concurrent_trials=1", *extra, THREE_LRS,
                    "tiny.steps=40", "tiny.sleep_s=0.05", "tracking.system_metrics=false",
                    f"tracking.uri={uri}", f"output_dir={tmp_path}/out", *attach_overrides())
    client = MlflowClient(uri)

    def runs(status=None):
        try:
            found = client.search_runs([e.experiment_id for e in client.search_experiments()])
        except Exception:
            return []
        return [r for r in found if status is None or r.info.status == status]

    return args, tiny_cli_env(), client, runs


@pytest.mark.slow
def test_interrupted_sweep_exits_130_and_resumes_where_it_stopped_one_trial_at_a_time(ray_session, tmp_path):
    """One trial finished, the next one's process lost (it errors: no retries), the sweep
    interrupted (Ctrl-C) while the third runs: exit 130, the parent and the running trial closed
    KILLED as interrupted. The same command resumes it: the finished trial is not trained again,
    the errored and the interrupted ones are, and ``sweep.max_concurrent_trials=1`` still holds
    (Tune restores an errored trial and an unfinished one PENDING together and started both at
    once: each waited for CPUs the other held, on a real workload); one parent, FINISHED."""
    import os

    args, env, client, runs = _one_at_a_time_sweep(tmp_path, "sweep.max_failures=0")

    def children(status=None):
        return [r for r in runs(status) if "mlflow.parentRunId" in r.data.tags]

    def wait_for(what, deadline_s=300):
        deadline = time.time() + deadline_s
        while time.time() < deadline:
            found = what()
            if found:
                return found
            time.sleep(0.5)
        raise AssertionError((tmp_path / "first.log").read_text()[-3000:])

    def started(r) -> bool:  # a trial's run exists a moment before its params and pid are written
        return "tiny.lr" in r.data.params and "orchard.pid" in r.data.tags

    log = open(tmp_path / "first.log", "w")  # a file, not a pipe nobody reads while waiting
    first = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    (done_first,) = wait_for(lambda: children("FINISHED"))
    (lost,) = wait_for(lambda: [r for r in children("RUNNING") if started(r)])
    os.kill(int(lost.data.tags["orchard.pid"]), signal.SIGKILL)  # the trial's process, lost: its trial errors
    seen = {done_first.data.params["tiny.lr"], lost.data.params["tiny.lr"]}
    wait_for(lambda: [r for r in children("RUNNING") if started(r) and r.data.params["tiny.lr"] not in seen])
    first.send_signal(signal.SIGINT)  # one trial finished, one errored, one running
    first.wait(timeout=180)
    assert first.returncode == 130, (tmp_path / "first.log").read_text()[-3000:]
    parent = next(r for r in runs() if "orchard.sweep" in r.data.tags)
    assert parent.info.status == "KILLED"
    assert not runs("RUNNING"), "the interrupted trial's run is closed too"
    assert children("KILLED") and all("interrupted" in r.data.tags.get("orchard.error", "")
                                      for r in children("KILLED"))
    resumed_at = time.time() * 1000
    second = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming" in second.stdout and "up to 1 trial(s) at once" in second.stdout
    after = sorted((r for r in children() if r.info.start_time >= resumed_at), key=lambda r: r.info.start_time)
    # the finished trial was not trained again; the errored and the interrupted ones were
    assert sorted(r.data.params["tiny.lr"] for r in after) == sorted({"0.01", "0.1", "0.3"} - {done_first.data.params["tiny.lr"]}), [
        r.info for r in after]
    for before, following in zip(after, after[1:]):
        assert following.info.start_time >= before.info.end_time, (
            f"trials ran at once after the resume: {before.data.params['tiny.lr']} and "
            f"{following.data.params['tiny.lr']}")
    assert all(r.info.status == "FINISHED" for r in after)
    assert {r.data.tags["mlflow.parentRunId"] for r in (done_first, *after)} == {parent.info.run_id}  # one sweep, one parent
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and "best/train/loss" in parent.data.metrics


@pytest.mark.slow
def test_a_sweep_with_the_default_store_and_output_folder_keeps_every_trial_there(ray_session, tmp_path):
    """As docs/sweeps.md types it, from a fresh folder with the defaults (``sqlite:///mlflow.db``,
    ``outputs/``): Tune runs each trial in a folder of its own, yet the trials record into the
    folder's store under their parent and keep their run folders, each with its log, in its ``outputs/``."""
    from mlflow.tracking import MlflowClient

    done = subprocess.run(tiny_cli("workload=tiny", "sweep=tiny_grid", TWO_LRS, "tiny.steps=5", *attach_overrides()),
                          cwd=tmp_path, env=tiny_cli_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (parent,) = [r for r in found if "orchard.sweep" in r.data.tags]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [r.info.status for r in (parent, *children)] == ["FINISHED"] * 3
    for child in children:
        folder = Path(child.data.tags["orchard.run_dir"])
        assert folder.parent == tmp_path / "outputs" / "tiny"
        # each trial's log, as a single run's, in its folder and its MLflow run
        assert (folder / "orchard.log").is_file()
        assert "orchard.log" in [a.path for a in client.list_artifacts(child.info.run_id)]
    assert "orchard: sweep: trial " in done.stdout  # the sweep's progress on its console


@pytest.mark.slow
def test_trials_that_share_a_declared_gpu_run_as_many_at_once_as_its_memory_holds(tmp_path):
    """Ray's GPU resource declared on this CPU machine (``cluster.num_gpus=1``): four trials that
    each hold a quarter of the GPU (the tiny workload's ``tiny.gpus``, as a single-worker flower
    trial's ``strategy.gpus_per_worker``), which the shares and the 4 CPUs would run all at once.
    The first runs alone until it reports what it holds on the GPU (``tiny.gpu_memory``, logged as
    orchard/tracking/gpu_peak.py logs it from a worker on a GPU: the GPU is what cannot exist
    here); then the GPU's memory decides: 2,400 + 500 MiB at 1.2x in 90% of 8,000 MiB is two at
    once. Each trial's task is given the GPU, every trial is a child run (issue 49)."""
    from mlflow.tracking import MlflowClient

    env = {k: v for k, v in tiny_cli_env().items() if k != "RAY_ADDRESS"}  # its own Ray, with a GPU
    done = subprocess.run(tiny_cli("workload=tiny", "sweep=tiny_grid", "sweep.max_concurrent_trials=null",
                                   "tiny.gpus=0.25", "tiny.gpu_memory={torch_peak_mb: 2400, other_mb: 500, total_mb: 8000}",
                                   "tiny.steps=5", "cluster.num_cpus=4", "cluster.num_gpus=1",
                                   "tracking.system_metrics=false", "progress=never"),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "up to 4 trial(s) at once (one, until a trial's GPU memory is measured)" in done.stdout
    assert "a trial needs 2.83 GiB of the GPU's 7.8 GiB" in done.stdout and "up to 2 trial(s) at once" in done.stdout
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (parent,) = [r for r in found if "orchard.sweep" in r.data.tags]
    children = sorted((r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
                      key=lambda r: r.info.start_time)
    assert "GPU: 0.25" in parent.data.tags["orchard.sweep.trial_resources"]
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.metrics["worker/gpus_seen"] == 1 for c in children)  # the trial's share, on GPU 0
    assert all(c.data.metrics["system/w0_gpu_torch_peak_mb"] == 2400 for c in children)
    first, rest = children[0], children[1:]
    assert all(first.info.end_time <= c.info.start_time for c in rest)  # alone until it was measured
    spans = [(c.info.start_time, c.info.end_time) for c in rest]
    assert max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) <= 2  # three left, two at once


@pytest.mark.slow
def test_sigterm_of_a_sweep_exits_143_with_parent_and_running_trial_killed(ray_session, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)  # created once, before this test's client polls it beside the sweep (docs/runs.md)
    args = tiny_cli("workload=tiny", "sweep=tiny_grid", "sweep.max_concurrent_trials=1", TWO_LRS, "tiny.steps=100",
                    "tiny.sleep_s=0.1", "tracking.system_metrics=false", f"tracking.uri={uri}",
                    f"output_dir={tmp_path}/out", *attach_overrides())
    log = open(tmp_path / "sweep.log", "w")  # a file, not a pipe nobody reads while waiting
    proc = subprocess.Popen(args, cwd=tmp_path, env=tiny_cli_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    client = MlflowClient(uri)

    def runs():
        try:
            return client.search_runs([e.experiment_id for e in client.search_experiments()])
        except Exception:
            return []

    deadline = time.time() + 300
    while time.time() < deadline and not any("mlflow.parentRunId" in r.data.tags and r.info.status == "RUNNING"
                                             for r in runs()):
        time.sleep(0.5)
    assert proc.poll() is None, (tmp_path / "sweep.log").read_text()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=180)
    out = (tmp_path / "sweep.log").read_text()
    assert proc.returncode == 143, out
    assert "interrupted (SIGTERM)" in out
    statuses = {r.data.tags.get("orchard.sweep", "child"): r.info.status for r in runs()}
    assert statuses == {"tiny_grid": "KILLED", "child": "KILLED"}


@pytest.mark.slow
def test_a_trial_that_failed_by_itself_is_not_trained_again(tiny_sweep, tracking_uri):
    """``sweep.max_failures`` retries a trial whose process was lost (tests/integration/
    test_node_loss.py); a trial whose run failed by itself raises its error again at once on
    Tune's retry: one FAILED run for the trial, not one per attempt."""
    from mlflow.tracking import MlflowClient

    outcome, console = tiny_sweep("tiny.fail=true", "tiny.steps=5", "sweep.max_failures=2")
    assert outcome.exit_code == 1
    # the console says why, once per cause: how many trials failed of it, and the cause
    assert "orchard: sweep: trial " in console and " failed: " in console
    causes = [line for line in console.splitlines() if line.startswith("orchard: 1 trial(s) failed (")]
    assert len(causes) == 1 and "asked to fail" in causes[0], console[-2000:]
    client = MlflowClient(tracking_uri)
    parent = client.get_run(outcome.run_id)
    (child,) = _children(client, parent)
    assert child.info.status == "FAILED" and "asked to fail" in child.data.tags["orchard.error"]
    assert "orchard.trial_attempt" not in child.data.tags and "trial/retries" not in child.data.metrics
    assert parent.info.status == "FAILED" and "asked to fail" in parent.data.tags["orchard.error"]


