"""The run lifecycle as a user meets it: real orchard processes stopped by Ctrl-C, SIGTERM and
SIGKILL at awkward moments, started four at a time on one fresh store, pointed at a real
``mlflow server``, and resumed; refusals before anything starts.

orchard's own semantics (exit codes, statuses, process groups, the store lock) are tested on the
tiny workload or one Ray Train workload (flower: SIGKILL, reap, resume); each workload's own stop
and resume is tested where its runs are (a Ctrl-C or SIGTERM of every workload on two nodes, Ray
Train's runs and singa's actors among them, then resumed from the bucket: test_cluster_storage.py).
A process whose test is about Ray's own start or stop has its own embedded Ray, as on a user's
machine; the others attach to the test session's Ray. The store is read back with MlflowClient.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from orchard.run.ending import CLOSE_BUDGET_S
from tests.session_ray import attach_overrides
from tests.tiny_workload.cli import main_in_process, tiny_cli

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def orchard(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchard", *args]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def runs(uri: str) -> list:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return client.search_runs(exps, order_by=["attributes.start_time DESC"]) if exps else []


def resume_to_finished(previous, uri: str, cwd: Path, *again: str):
    """``python -m orchard resume <id>``: exit 0, and the newest run FINISHED, tagged with ``previous``.
    The id as listings shorten it (its first 8 characters): a unique prefix names the run; its
    output_dir and ``again`` (where it ran) given again (a resume takes those from the command line only)."""
    done = subprocess.run(orchard("resume", previous.info.run_id[:8], f"tracking.uri={uri}", f"output_dir={cwd}/out",
                                  *again), cwd=cwd, env=env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    new = runs(uri)[0]
    assert new.info.status == "FINISHED" and new.data.tags["orchard.resumes"] == previous.info.run_id
    return new


class Orchard:
    """A ``python -m orchard`` process whose output is read line by line as it comes."""

    def __init__(self, *args: str, cwd: Path, argv: list[str] | None = None):
        self.proc = subprocess.Popen(argv or orchard(*args), cwd=cwd, env=env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, at_least: int, timeout_s: float = 600) -> None:
        """Block until a printed line matches ``pattern`` with its first group, a number, at least
        ``at_least``. The progress line is redrawn from the latest report every 0.5 s, so a fast
        epoch can be skipped: never wait for one exact epoch."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if any(int(m.group(1)) >= at_least for line in self.lines for m in re.finditer(pattern, line)):
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)
                break
            time.sleep(0.2)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        raise AssertionError(f"no line matching {pattern!r} (at least {at_least}) within {timeout_s}s; output:\n{self.output()[-3000:]}")

    def wait_for_text(self, text: str, timeout_s: float = 300) -> None:
        """Block until a printed line contains ``text`` (the state to interrupt, not a guess of
        how long the machine takes to get there)."""
        deadline = time.time() + timeout_s
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.time() > deadline:
                if self.proc.poll() is None:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                raise AssertionError(f"no line with {text!r} within {timeout_s}s; output:\n{self.output()[-3000:]}")
            time.sleep(0.02)

    # orchard's close gives a busy store up to ending.CLOSE_BUDGET_S; CI once saw a forest
    # run's sqlite store locked at close under load, still closing 120 s after SIGTERM. The test
    # waits for that budget and a minute more.
    def stop(self, sig: int, timeout_s: float = CLOSE_BUDGET_S + 60, group: bool = False) -> int:
        if group:  # to orchard's whole process group, as `timeout`, `kill -TERM -<pgid>` or a shell do
            os.killpg(self.proc.pid, sig)
        else:  # to orchard only, as `kill` or a job scheduler would
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leave no orchard (and its Ray) behind
            raise AssertionError(f"orchard still running {timeout_s}s after {signal.Signals(sig).name}; "
                                 f"output:\n{self.output()[-3000:]}") from None
        finally:
            self._reader.join(timeout=5)

    def wait(self, timeout_s: float = 600) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return rc

    def output(self) -> str:
        return "".join(self.lines)


def processes_in_group(pgid: int) -> list[str]:
    names = []
    for proc in psutil.process_iter(["name"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                names.append(proc.info["name"])
        except (ProcessLookupError, psutil.Error):
            pass
    return names


def common(tmp_path: Path, uri: str) -> list[str]:
    return [f"tracking.uri={uri}", f"output_dir={tmp_path}/out", "debug=smoke", "progress=always"]


# --------------------------------------------------------------------------- Ctrl-C and SIGTERM
def _ended_killed(run: "Orchard", rc: int, sig: int, uri: str) -> None:
    """Exit 128 + the signal, the run KILLED naming it; orchard's own process ended cleanly (lines
    from Ray's actors start with "(Name pid=...)") and every thread of the run returned before Ray
    stopped (a Ray Train run is aborted, not awaited)."""
    assert rc == 128 + sig, run.output()[-3000:]
    (latest,) = runs(uri)
    assert latest.info.status == "KILLED"
    assert signal.Signals(sig).name in latest.data.tags.get("orchard.error", "")
    assert not [line for line in run.lines if "Traceback" in line and "pid=" not in line]
    assert "threads still in it" not in run.output(), run.output()[-3000:]


def test_sigterm_to_the_whole_process_group_leaves_ray_to_orchard_and_ends_143(tmp_path):
    """SIGTERM to orchard's whole process group, as `timeout -s TERM` sends it: Ray's own processes
    are in groups of their own (orchard/cluster/__init__.py), stay up while orchard closes the run,
    and are stopped by orchard. Its own embedded Ray: the test is about where Ray's processes start."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = Orchard(cwd=tmp_path, argv=tiny_cli("workload=tiny", "tiny.steps=4000", "tiny.sleep_s=0.05",
                                              f"tracking.uri={uri}", f"output_dir={tmp_path}/out", "progress=always"))
    run.wait_for(r"train\s+\|[#\s]*\|\s+(\d+)/", 1)
    assert not {"raylet", "gcs_server"} & set(processes_in_group(run.proc.pid))
    _ended_killed(run, run.stop(signal.SIGTERM, group=True), signal.SIGTERM, uri)


def test_interrupt_while_ray_starts_leaves_no_open_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = Orchard("workload=singa", "singa.arch=local", *common(tmp_path, uri), cwd=tmp_path)
    # the console's first line is printed once the config is composed and checked, right before
    # Ray starts (lifecycle.open_console, then execute): the signal lands while Ray starts (its
    # 2-5 s) or, on a machine fast enough, while the run opens or trains; never after the run ended
    run.wait_for_text("orchard: workload=singa")
    rc = run.stop(signal.SIGTERM)
    assert rc == 143, run.output()[-2000:]
    assert "FINISHED" not in run.output()
    assert all(r.info.status != "RUNNING" for r in runs(uri))


# --------------------------------------------------------------------------- SIGKILL, then reap
def test_sigkilled_driver_is_closed_by_runs_reap_and_then_resumed(ray_session, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # the SIGKILL lands after the first checkpoint (epoch 1 of 4); the resume trains the rest
    run = Orchard("workload=flower", "strategy=ring", "flower.epochs=4", *common(tmp_path, uri), *attach_overrides(),
                  cwd=tmp_path)
    # mid-training, once Ray Train has registered a checkpoint (checkpoint_every=1): progress
    # lines are throttled, so the checkpoint manager's own snapshot is what the test waits for
    deadline = time.time() + 600
    while not list((tmp_path / "out").glob("flower/*/train/flower/checkpoint_manager_snapshot.json")):
        assert run.proc.poll() is None and time.time() < deadline, run.output()[-3000:]
        time.sleep(0.1)
    run.proc.kill()
    run.wait(60)
    (lost,) = runs(uri)
    assert lost.info.status == "RUNNING"  # nothing could close it: the process had no say
    # and it left nothing behind that polls for the cluster's lifetime: where the Ray serves no
    # state API (the session's, started as a run embeds it), no Ray Train placement-group cleaner
    # was started (it would outlive the run, polling "unavailable")
    from ray._private import state

    from orchard.cluster import ray_private

    cleaners = [a for a in state.actors(actor_state_name="ALIVE").values()
                if a.get("ActorClassName", "").endswith("PlacementGroupCleaner")]
    assert ray_private.has_state_api() or not cleaners, cleaners
    reap = subprocess.run(orchard("runs", "reap", f"tracking.uri={uri}"), cwd=tmp_path, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert reap.returncode == 0 and lost.info.run_id in reap.stdout, reap.stdout + reap.stderr
    (closed,) = runs(uri)
    assert closed.info.status == "FAILED" and "driver lost" in closed.data.tags["orchard.error"]

    # resume: a new run, tagged with the one it continues, picks up at the checkpoint
    new = resume_to_finished(lost, uri, tmp_path, *attach_overrides())
    assert new.data.metrics["train/resumed_from_epoch"] >= 1
    # the resumed run continued the first run's checkpoints, and says so for a resume of its own
    storage = (Path(new.data.tags["orchard.run_dir"]) / "train_storage.txt").read_text()
    assert storage == str(Path(lost.data.tags["orchard.run_dir"]) / "train")


def test_forest_resume_after_a_crash_continues_from_the_last_round(ray_session, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    crashed = subprocess.run(orchard("workload=forest", "forest.stop_after_rounds=2", *common(tmp_path, uri),
                                     *attach_overrides()),
                             cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert crashed.returncode == 1, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    (failed,) = runs(uri)
    assert failed.info.status == "FAILED"
    assert f"resume {failed.info.run_id}" in crashed.stdout  # the summary says how to go on
    new = resume_to_finished(failed, uri, tmp_path, *attach_overrides())
    assert new.data.params["forest.resume"] != "None" and new.data.metrics["train/resumed_from_round"] == 2
    again = subprocess.run(orchard("resume", new.info.run_id, f"tracking.uri={uri}"), cwd=tmp_path, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "KILLED or FAILED" in again.stderr


# --------------------------------------------------------------------------- fast, clear refusals
@pytest.mark.parametrize("override, key", [
    ("output_dir=/proc/orchard-cannot-write-here", "output_dir"),
    ("tracking.uri=http://127.0.0.1:9", "tracking.uri"),
    ("cluster=remote", "cluster.address"),
])
def test_unusable_output_dir_store_or_cluster_is_one_line_and_exit_2(tmp_path, override, key, capfd):
    extra = ["cluster.address=127.0.0.1:9"] if override == "cluster=remote" else []
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code, err = main_in_process(["workload=singa", "debug=smoke", f"tracking.uri={uri}", f"output_dir={tmp_path}/out", override,
                      *extra], capfd)
    assert code == 2, err
    # refused before Ray started: no console line of a started run, no session log of Ray's
    assert not (tmp_path / "out" / "logs").exists() or not list((tmp_path / "out" / "logs").iterdir())
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and key in lines[0], err
    if override.startswith("tracking"):
        return
    assert all(r.info.status != "RUNNING" for r in runs(uri))


# --------------------------------------------------------------------------- concurrency
def test_four_runs_started_together_on_one_fresh_store_all_finish(ray_session, tmp_path):
    """Four processes create the same new store at once (orchard makes it once, under a lock)."""
    uri = f"sqlite:///{tmp_path}/fresh.db"
    procs = [subprocess.Popen(tiny_cli("workload=tiny", "tiny.steps=5", f"tracking.uri={uri}",
                                       f"output_dir={tmp_path}/o{i}", *attach_overrides()),
                              cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(4)]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    statuses = [r.info.status for r in runs(uri)]
    assert statuses == ["FINISHED"] * 4


# --------------------------------------------------------------------------- a team's tracking server
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on 127.0.0.1 with a sqlite backend and proxied artifacts, as in the README."""
    import urllib.request

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path}/server.db", "--artifacts-destination", str(tmp_path / "artifacts"),
         "--workers", "1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                break
        except OSError:
            time.sleep(1)
    else:
        os.killpg(server.pid, signal.SIGKILL)
        pytest.fail("mlflow server did not answer /health within 120 s")
    yield url
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


def test_a_run_against_a_real_mlflow_server_records_metrics_and_artifacts(ray_session, mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    done = subprocess.run(tiny_cli("workload=tiny", "tiny.steps=5", f"tracking.uri={mlflow_server}",
                                   f"output_dir={tmp_path}/out", *attach_overrides()),
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = runs(mlflow_server)
    assert run.info.status == "FINISHED"
    # from the driver and from a Ray task, through the server
    assert {"train/final_loss", "worker/final_loss"} <= set(run.data.metrics)
    # the team's server is named at start, where the run can be watched while it trains
    assert f"orchard: MLflow run {run.info.run_id} at {mlflow_server}" in done.stdout, done.stdout[-2000:]
    names = [a.path for a in MlflowClient(mlflow_server).list_artifacts(run.info.run_id)]
    assert "config.yaml" in names


def test_every_workloads_preflight_passes_in_a_process_without_ray(tmp_path):
    """The preflight's fit check runs before any Ray exists: a workload that sizes its groups to
    the running Ray (singa) is left to the check after Ray starts, never an internal error."""
    script = ("import sys\n"
              "from orchard.run.lifecycle import preflight, prepare\n"
              "for name in ('flower', 'forest', 'video', 'singa'):\n"
              "    cfg, module = prepare([f'workload={name}', 'debug=smoke', 'tracking=none', f'output_dir={sys.argv[1]}'])\n"
              "    preflight(cfg, module)\n"
              "import ray\n"
              "assert not ray.is_initialized()\n"
              "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout[-2000:] + done.stderr[-3000:]


def test_workers_that_cannot_fit_the_machine_are_refused_before_ray_starts(ray_session, tmp_path, capfd, monkeypatch):
    """Refused in the preflight, from the cores an embedded Ray would have: no Ray start (which
    would take the run a minute on a busy machine), no run, one line naming the key."""
    from orchard import cluster

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for a run that cannot fit")

    monkeypatch.setattr(cluster, "connect", no_ray)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code, err = main_in_process(["workload=flower", "strategy=ring", "strategy.num_workers=4", "debug=smoke",
                      f"tracking.uri={uri}", f"output_dir={tmp_path}/out"], capfd)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "strategy" in lines[0] and "4 CPU" in lines[0], err
    assert runs(uri) == []
