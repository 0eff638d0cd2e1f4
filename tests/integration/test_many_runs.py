"""Many runs at once, as people start them: a sweep in one terminal while other runs (each with
its own embedded Ray) come and go, two runs in folders of the same name, the same sweep twice,
two resumes of one run. Every process is a real ``python -m orchard``; the store is read back
with MlflowClient (docs/runs.md, "Concurrency")."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.test_lifecycle import env, orchard, runs
from tests.orchard.sweep.test_sweep import TWO_LRS
from tests.session_ray import attach_overrides
from tests.tiny_workload.cli import main_in_process, tiny_cli, tiny_cli_env

pytestmark = pytest.mark.slow


def _start(args: list[str], cwd: Path, log: Path, environ: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, env=environ or env(), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _store(uri: str) -> str:
    """The store created (under orchard's lock) before this test's own readers poll it: MLflow
    creating one store from two processes at once breaks it (docs/runs.md)."""
    from orchard.tracking.store import check_store

    check_store(uri)
    return uri


def _children(uri: str) -> list:
    try:
        return [r for r in runs(uri) if "mlflow.parentRunId" in r.data.tags]
    except Exception:  # the store is busy with another writer this instant
        return []


def test_a_flower_sweep_beside_runs_with_their_own_ray_runs_one_trial_at_a_time_and_finishes(tmp_path, capfd):
    """The shipped flower sweep (its grid once: 2 trials, ASHA, one at a time on 2 cores) while runs with Ray
    instances of their own (the tiny workload, each its own embedded Ray) start and stop beside it,
    and the same sweep command is started a second time. A trial ASHA stops must give its CPUs back
    at once (its Ray Train run aborted) and its MLflow run must close then, so the next trial's
    workers start and MLflow never shows two trials RUNNING; the second command is refused,
    naming the first, and touches nothing: the first sweep's parent and trials end FINISHED (or
    stopped by ASHA, saying so), none KILLED (the suite's only same-sweep-twice test: its tiny
    twin, which checked the same, was dropped for CI's time)."""
    uri = _store(f"sqlite:///{tmp_path}/sweep.db")
    # one draw per grid point (shipped: 2 draws x 2 batch sizes, 4 trials; every other setting as
    # shipped): one trial at a time, a stopped trial's CPUs and run given back at once and the
    # ranking need two trials, not four
    sweep_args = ["workload=flower", "sweep=flower_lr", "sweep.num_samples=1", "debug=smoke", f"tracking.uri={uri}",
                  f"output_dir={tmp_path}/sweep"]
    sweep = _start(orchard(*sweep_args), tmp_path, tmp_path / "sweep.log")
    most_running, deadline = 0, time.time() + 1500
    try:
        while not any(r.info.status == "RUNNING" for r in _children(uri)):  # the sweep holds its lease
            assert sweep.poll() is None and time.time() < deadline, (tmp_path / "sweep.log").read_text()[-3000:]
            time.sleep(1)
        code, err = main_in_process(sweep_args, capfd)  # refused before Ray: in this process
        assert code == 2 and f"already driven by pid {sweep.pid}" in err, err
        for i in range(2):  # plain runs, each with its own Ray, come and go while the sweep trains
            done = subprocess.run(tiny_cli("workload=tiny", "tiny.steps=20", f"tracking.uri=sqlite:///{tmp_path}/plain{i}.db",
                                           f"output_dir={tmp_path}/p{i}"), cwd=tmp_path, env=tiny_cli_env(),
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            assert runs(f"sqlite:///{tmp_path}/plain{i}.db")[0].info.status == "FINISHED"
        while sweep.poll() is None:
            assert time.time() < deadline, "the sweep did not end within 25 minutes"
            most_running = max(most_running, sum(r.info.status == "RUNNING" for r in _children(uri)))
            time.sleep(1)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    out = (tmp_path / "sweep.log").read_text()
    assert sweep.returncode == 0, out[-3000:]
    assert most_running <= 1, f"{most_running} trials RUNNING at once with max_concurrent_trials 1"
    # the sweep's console: a line as each trial starts and ends, the last with every trial done
    progress = [line for line in out.splitlines() if line.startswith("orchard: sweep: trial ")]
    assert len(progress) == 4 and "2/2 done" in progress[-1], out[-3000:]
    children = _children(uri)
    assert len(children) == 2 and not [r for r in runs(uri) if r.info.status == "RUNNING"]
    for r in children:  # finished, or stopped by ASHA and closed saying so; none starved
        assert r.info.status == "FINISHED" or "scheduler" in r.data.tags.get("orchard.error", ""), \
            (r.info.status, r.data.tags.get("orchard.error"), out[-3000:])
        # and each keeps its log, in its folder and its run, a trial Tune killed too (sweep/trials.py)
        assert (Path(r.data.tags["orchard.run_dir"]) / "orchard.log").read_text().strip(), r.info.status
        assert "orchard.log" in [a.path for a in MlflowClient(uri).list_artifacts(r.info.run_id)], r.info.status
    _assert_the_shipped_flower_sweep_ranked_its_trials(uri, children)


def _assert_the_shipped_flower_sweep_ranked_its_trials(uri: str, children: list) -> None:
    """What tests/integration/test_sweeps.py checks of every other shipped sweep, checked of
    flower_lr here (its whole sweep runs here already): the parent FINISHED with the best trial's
    metric and id, one dataset for all, each trial's note and headline, and ASHA's time axis:
    one val/mae per epoch from the Train workers."""
    client = MlflowClient(uri)
    parent = client.get_run(children[0].data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FINISHED" and "best/val/mae" in parent.data.metrics
    assert parent.data.tags["best_run_id"] in {c.info.run_id for c in children}
    digests = {r.inputs.dataset_inputs[0].dataset.digest for r in (parent, *children)}
    assert len(digests) == 1
    finished = [c for c in children if c.info.status == "FINISHED" and "orchard.error" not in c.data.tags]
    assert finished  # ASHA lets the best trial train to the end
    for child in children:
        assert " · trial " in child.data.tags["mlflow.note.content"]
        history = client.get_metric_history(child.info.run_id, "val/mae")
        assert len({m.step for m in history}) == len(history) >= 1
    for child in finished:
        assert any(k.startswith("headline/") for k in child.data.metrics)
        history = client.get_metric_history(child.info.run_id, "val/mae")
        assert len(history) == int(child.data.params["flower.epochs"])


def test_runs_in_folders_of_one_name_under_two_parents_never_share_checkpoints(ray_session, tmp_path, capfd):
    uri = f"sqlite:///{tmp_path}/mlflow.db"

    # the forest (a checkpoint every round, kept in its storage folder, not in the named folder
    # itself: workloads/forest/checkpoint.py) at smoke size, half a flower run's time; flower's
    # Ray Train checkpoints take the same storage folder (Storage.for_run)
    def forest_in(folder: Path) -> list[str]:
        return ["workload=forest", "debug=smoke", "forest.num_trees=1", f"hydra.run.dir={folder}",
                f"tracking.uri={uri}", f"output_dir={tmp_path}/out", *attach_overrides()]

    for parent in ("A", "B"):
        done = subprocess.run(orchard(*forest_in(tmp_path / parent / "exp")), cwd=tmp_path, env=env(),
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        newest = runs(uri)[0]
        assert "train/resumed_from_round" not in newest.data.metrics  # a fresh run, not A's continued
        assert newest.data.tags["orchard.run_dir"] == str((tmp_path / parent / "exp").resolve())
    # a new run in a folder a run already trained in is refused before Ray starts: only resume continues
    code, err = main_in_process(forest_in(tmp_path / "A" / "exp"), capfd)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "hydra.run.dir" in lines[0] and "resume" in lines[0], err
    assert len(runs(uri)) == 2


def test_a_second_resume_of_a_run_is_refused_naming_the_first(tmp_path):
    """Another process (here: this test) holds the lease of a KILLED run's resume: a resume of
    that run exits 2 with one line naming it, before Ray starts, and records nothing."""
    from orchard.tracking import leases

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    from orchard.storage import Storage

    (tmp_path / "run").mkdir()  # the run's folder, and Ray Train's folder in its storage, as a run leaves them
    cfg = {"output_dir": str(tmp_path / "out"), "storage": {"uri": None}, "workload": {"name": "flower"}}
    Storage.for_run(cfg, tmp_path / "run").write_text("train/flower/.keep", "")
    killed = client.create_run(client.create_experiment("flower"), tags={
        "orchard.overrides": json.dumps(["workload=flower", "debug=smoke", f"output_dir={tmp_path}/out"]),
        "orchard.run_dir": str(tmp_path / "run")}).info.run_id
    client.set_terminated(killed, status="KILLED")
    held = leases.take(client, killed, f"the resume of run {killed}", settle_s=0)
    try:
        done = subprocess.run(orchard("resume", killed, f"tracking.uri={uri}"), cwd=tmp_path, env=env(),
                              capture_output=True, text=True, timeout=300)
    finally:
        held.release()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"already driven by pid {os.getpid()}" in lines[0], done.stderr
    assert len(runs(uri)) == 1  # no new run opened


def test_many_drivers_attach_to_one_cluster_and_all_finish(ray_session, tmp_path):
    """The recommended way to share a machine: one Ray (here the test session's, as `ray start
    --head` leaves one), and every command attached to it: a sweep and a real workload's run at
    once, each its own Ray job; the cluster is left as it was."""
    address = ray_session.get_runtime_context().gcs_address
    uri = _store(f"sqlite:///{tmp_path}/mlflow.db")
    attach = ["cluster=remote", f"cluster.address={address}", f"tracking.uri={uri}", "tracking.system_metrics=false"]
    sweep = _start(tiny_cli("workload=tiny", "sweep=tiny_grid", "sweep.max_concurrent_trials=1", TWO_LRS,
                            "tiny.steps=5", f"output_dir={tmp_path}/sweep", *attach),
                   tmp_path, tmp_path / "sweep.log", tiny_cli_env())
    try:
        run = subprocess.run(orchard("workload=singa", "singa.arch=local", "debug=smoke", f"output_dir={tmp_path}/run",
                                     *attach), cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert sweep.wait(timeout=900) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sorted(r.info.status for r in runs(uri)) == ["FINISHED"] * 4  # the singa run, the sweep and its 2 trials
    assert ray_session.is_initialized() and ray_session.get(ray_session.remote(lambda: 1).remote()) == 1
