"""Ray Tune sweeps on the tiny test workload: parent + one child run per trial, a leaderboard,
identity by command, ASHA closing the trials it stops, Ctrl-C then resume.  The shipped sweeps
on the real workloads are tests/integration/test_sweeps.py."""
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchard import sweep_seal
from orchard.errors import ConfigError
from orchard.lifecycle import execute, preflight, prepare
from orchard.cluster.placement import HEAD, Resources, bundles
from orchard.storage import Storage
from orchard.sweep import identity_overrides, sweep_key
from orchard.tracking.store import check_store
from tests.session_ray import attach_overrides
from tests.tiny_workload.cli import tiny_cli, tiny_cli_env

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "sweep").glob("*.yaml"))
# smaller grids than tiny_grid's four learning rates: fewer trials, same behaviour
TWO_LRS = "sweep.params={tiny.lr: {type: grid, values: [0.01, 0.3]}}"
THREE_LRS = "sweep.params={tiny.lr: {type: grid, values: [0.01, 0.1, 0.3]}}"


def _sweep_overrides(*extra):
    return ["workload=tiny", "sweep=tiny_grid", *extra]


def _children(client, parent):
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")


def test_sweep_config_validation_names_the_key():
    with pytest.raises(ConfigError) as err:
        prepare(["workload=tiny", "sweep=tiny_typo"])
    assert err.value.key == "sweep.params.tiny.lrr"
    with pytest.raises(ConfigError) as err:
        prepare(_sweep_overrides("sweep.mode=best"))
    assert err.value.key == "sweep.mode"
    with pytest.raises(ConfigError) as err:  # CPU counts are the workload's to say, not the sweep file's
        prepare(_sweep_overrides("+sweep.resources_per_trial={cpu: 1}"))
    assert err.value.key == "sweep.resources_per_trial"


def test_no_shipped_sweep_writes_cpu_counts():
    for name in SHIPPED:
        text = (Path(__file__).resolve().parents[2] / "conf" / "sweep" / f"{name}.yaml").read_text()
        assert "resources_per_trial" not in text and "cpu:" not in text.lower(), name


def test_sweep_identity_is_the_command_less_where_it_runs_and_records():
    base = ["workload=tiny", "sweep=tiny_grid", "tiny.steps=7"]
    cfg, _ = prepare(base)
    cfg["_overrides"] = base
    same = dict(cfg, _overrides=["tiny.steps=7", "tracking.uri=sqlite:///elsewhere.db", "output_dir=/tmp/x",
                                 "sweep=tiny_grid", "cluster.num_cpus=2", "workload=tiny", "progress=never"])
    other = dict(cfg, _overrides=[*base, "tiny.lr=0.2"])
    assert sweep_key(cfg) == sweep_key(same)
    assert sweep_key(cfg) != sweep_key(other)
    assert sweep_key(cfg).startswith("tiny-tiny_grid-")
    assert identity_overrides(["tracking=none", "+tiny.x=1", "cluster=remote"]) == ["+tiny.x=1"]


def test_placement_reserves_what_a_trial_starts_and_limits_concurrency():
    actors = Resources(in_trial=bundles(2, 1.0))        # tasks/actors the trial starts itself
    train = Resources(in_trial=bundles(1, 1.0), outside=bundles(2, 1.0))  # + a Train worker group
    cluster = {"CPU": 2.0, "memory": 8 * 2**30}
    assert actors.factory().bundles == [HEAD, {"CPU": 1.0}, {"CPU": 1.0}]
    assert Resources(outside=bundles(2, 1.0)).factory().bundles == [HEAD]  # a small head, no CPU
    assert actors.max_concurrent(cluster) == 1
    assert actors.max_concurrent({"CPU": 8.0, "memory": 8 * 2**30}) == 4
    assert actors.max_concurrent({"CPU": 8.0, "memory": 8 * 2**30}, requested=3) == 3
    with pytest.raises(ConfigError, match="CPU 3 .cluster: 2"):
        train.max_concurrent(cluster)
    gpu = Resources(outside=bundles(2, 1.0, gpu=1.0))
    with pytest.raises(ConfigError, match="GPU"):
        gpu.max_concurrent(cluster)
    assert gpu.max_concurrent({**cluster, "CPU": 4.0, "GPU": 4.0}) == 2


def test_every_shipped_sweep_fits_a_two_core_machine(ray_session):
    """Each workload says what a trial starts; every shipped sweep runs on 2 cores."""
    import importlib

    workloads = {"flower": "flower_lr", "forest": "forest_features", "singa": "singa_mlp", "video": "video_lr"}
    assert sorted(workloads.values()) == SHIPPED  # every workload ships a sweep, every sweep is tested
    two_cores = {"CPU": 2.0, "memory": 8 * 2**30}
    for workload, sweep in workloads.items():
        cfg, module = prepare([f"workload={workload}", f"sweep={sweep}"])
        need = module.resources(cfg)
        assert isinstance(need, Resources), workload
        assert need.max_concurrent(two_cores) >= 1, (workload, need.describe())
    flower, _ = prepare(["workload=flower", "strategy.num_workers=3"])
    need = importlib.import_module("workloads.flower").resources(flower)
    assert need.outside == bundles(3, 1.0)  # Ray Train workers: their own placement group
    video, _ = prepare(["workload=video"])
    need = importlib.import_module("workloads.video").resources(video)
    assert len(need.outside) == sum(video["video"]["workers"].values())


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
    board = json.loads(Path(client.download_artifacts(parent.info.run_id, "leaderboard.json")).read_text())
    assert [row["params"]["tiny.lr"] for row in board] == [0.3]  # a trial cut early is not ranked
    # the console says so as it happens
    assert "stopped early by the scheduler; 2/2 done (1 stopped early), 0 running, 0 failed" in console, console[-2000:]


@pytest.mark.slow
def test_interrupted_sweep_exits_130_and_resumes_where_it_stopped(ray_session, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)  # created once, before this test's client polls it beside the sweep (docs/runs.md)
    args = tiny_cli("workload=tiny", "sweep=tiny_grid", "sweep.max_concurrent_trials=1", THREE_LRS,
                    "tiny.steps=40", "tiny.sleep_s=0.05", "tracking.system_metrics=false",
                    f"tracking.uri={uri}", f"output_dir={tmp_path}/out", *attach_overrides())
    env = tiny_cli_env()
    client = MlflowClient(uri)

    def runs(status=None):
        try:
            found = client.search_runs([e.experiment_id for e in client.search_experiments()])
        except Exception:
            return []
        return [r for r in found if status is None or r.info.status == status]

    def children(status):
        return [r for r in runs(status) if "mlflow.parentRunId" in r.data.tags]

    log = open(tmp_path / "first.log", "w")  # a file, not a pipe nobody reads while waiting
    first = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not (children("FINISHED") and children("RUNNING")):
        time.sleep(0.5)
    done_before = {r.data.params["tiny.lr"] for r in children("FINISHED")}
    assert 1 <= len(done_before) < 3, "the sweep should be part-way, a trial running, when interrupted"
    first.send_signal(signal.SIGINT)
    first.wait(timeout=180)
    out = (tmp_path / "first.log").read_text()
    assert first.returncode == 130, out
    parent = next(r for r in runs() if "orchard.sweep" in r.data.tags)
    assert parent.info.status == "KILLED"
    assert not runs("RUNNING"), "the interrupted trial's run is closed too"
    assert all("interrupted" in r.data.tags.get("orchard.error", "") for r in children("KILLED"))
    second = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming" in second.stdout
    done = children("FINISHED")
    lrs = [r.data.params["tiny.lr"] for r in done]
    assert sorted(set(lrs)) == ["0.01", "0.1", "0.3"]
    for lr in done_before:  # finished trials were not trained again
        assert lrs.count(lr) == 1
    assert {r.data.tags["mlflow.parentRunId"] for r in done} == {parent.info.run_id}  # one sweep, one parent
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"


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


# --------------------------------------------------------------------------- non-finite metrics
def _trials(values):
    """Finished Tune trials (what ``leaderboard`` reads of them) with these sweep metrics."""
    from types import SimpleNamespace

    from orchard.sweep import FINAL

    return [SimpleNamespace(trial_id=f"t{i}", status="TERMINATED", config={"tiny.lr": (i + 1) / 10},
                            last_result={"train/loss": v, "run_id": f"run{i}", FINAL: 1.0})
            for i, v in enumerate(values)]


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("values, mode, best", [
    ([NAN, 2.0, 1.0], "min", 1.0), ([3.0, NAN, 1.0, 2.0], "min", 1.0),
    ([NAN, 2.0, 1.0], "max", 2.0), ([3.0, NAN, 1.0, 2.0], "max", 3.0),
    ([INF, -INF, 0.5, NAN], "min", 0.5), ([INF, -INF, 0.5, NAN], "max", 0.5)])
def test_a_diverged_trial_ranks_last_whatever_the_mode(values, mode, best):
    import math

    from orchard.sweep import best_row, leaderboard

    rows = leaderboard(_trials(values), ["tiny.lr"], "train/loss", mode)
    assert best_row(rows)["metric"] == best
    finite = [r["metric"] for r in rows if math.isfinite(r["metric"])]
    assert finite == sorted(finite, reverse=(mode == "max"))
    assert all(not math.isfinite(r["metric"]) for r in rows[len(finite):])   # the rest, after every finite one


def test_a_sweep_whose_every_trial_diverged_has_no_best_and_says_so(tracking_uri, tmp_path):
    """No ``best.*`` tags, no ``best/<metric>``, a strict-JSON leaderboard with null metrics."""
    from mlflow.tracking import MlflowClient

    from orchard.sweep import _Parent, best_row, leaderboard, no_best_line

    rows = leaderboard(_trials([NAN, INF, NAN]), ["tiny.lr"], "train/loss", "min")
    assert best_row(rows) is None and len(rows) == 3
    assert no_best_line(rows, "train/loss").startswith("no best trial: the train/loss of every one of the 3")
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("sweep-no-best") or client.get_experiment(client.create_experiment("sweep-no-best"))
    parent = _Parent(None, None)
    parent.client, parent.run_id = client, client.create_run(exp.experiment_id).info.run_id
    parent.record(rows, "train/loss", tmp_path)
    run = client.get_run(parent.run_id)
    assert not [t for t in run.data.tags if t.startswith("best")] and "best/train/loss" not in run.data.metrics
    board = json.loads((tmp_path / "leaderboard.json").read_text())   # json.loads accepts NaN: check the text
    assert [r["metric"] for r in board] == [None, None, None] and "NaN" not in (tmp_path / "leaderboard.json").read_text()


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


def test_the_retry_of_a_lost_attempt_reopens_its_run_and_a_closed_one_is_not_continued(tracking_uri, tmp_path):
    """What a trial's next attempt continues (``sweep._retry_of``): the run its lost attempt left
    RUNNING (or a reaper closed as "driver lost"), reopened by ``reopen_run`` with the attempt's
    number; a run another invocation of the sweep left is not continued; one that failed by
    itself is its error again."""
    from mlflow.tracking import MlflowClient

    from orchard.sweep import _retry_of
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
    assert _retry_of(tracking_uri, parent, "t_0", "s1", "t_0", cfg, module) == {"reopen": lost, "attempt": 2}
    assert _retry_of(tracking_uri, parent, "t_1", "s1", "t_1", cfg, module) == {"reopen": reaped, "attempt": 2}
    assert _retry_of(tracking_uri, parent, "t_0", "another session", "t_0", cfg, module) == {}
    assert _retry_of(tracking_uri, parent, "t_9", "s1", "t_9", cfg, module) == {}   # a first attempt
    with pytest.raises(RuntimeError, match="asked to fail.*not retried"):
        _retry_of(tracking_uri, parent, "t_2", "s1", "t_2", cfg, module)
    reopen_run(cfg, reaped, 2)
    run = client.get_run(reaped)
    assert run.info.status == "RUNNING" and "orchard.error" not in run.data.tags
    assert run.data.tags["orchard.trial_attempt"] == "2" and run.data.metrics["trial/retries"] == 1
    assert _retry_of(tracking_uri, parent, "t_1", "s1", "t_1", cfg, module)["attempt"] == 3

    # the workload's resume hook points the config at the lost attempt's folder; one that finds no
    # checkpoint there (lost before its first) leaves the config as it was: the trial starts over
    import types

    def resume(cfg, folder):
        cfg["tiny"]["resume"] = folder
        if not folder.endswith("t_0"):
            raise ConfigError("tiny.resume", "a folder holding a checkpoint")

    hooked = types.SimpleNamespace(resume=resume)
    assert _retry_of(tracking_uri, parent, "t_0", "s1", "t_0", cfg, hooked)["attempt"] == 2
    assert cfg["tiny"]["resume"] == str(tmp_path / "t_0")
    del cfg["tiny"]["resume"]
    assert _retry_of(tracking_uri, parent, "t_1", "s1", "t_1", cfg, hooked)["attempt"] == 3
    assert "resume" not in cfg["tiny"]
