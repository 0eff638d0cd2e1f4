"""Lost runs: who drives a run, when it counts as lost, and the reaper on a real sqlite store."""
import os
import socket
import subprocess
import sys
import time

from orchard import runs


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_this_process_is_alive_and_a_finished_process_is_lost():
    tags = runs.driver_tags()
    assert runs.why_lost(tags) is None
    gone = {**tags, "orchard.pid": str(_dead_pid())}
    assert "driver lost" in runs.why_lost(gone)


def test_a_reused_pid_is_not_mistaken_for_the_driver():
    tags = {**runs.driver_tags(), "orchard.pid_start": "12345.000"}  # same pid, another start time
    assert "driver lost" in runs.why_lost(tags)


def test_another_machine_is_judged_by_its_heartbeat():
    now = time.time()
    remote = {**runs.driver_tags(), "orchard.host": "elsewhere", runs.TAG_HEARTBEAT: f"{now - 30:.0f}"}
    assert runs.why_lost(remote, now) is None
    stale = {**remote, runs.TAG_HEARTBEAT: f"{now - runs.LOST_AFTER_S - 5:.0f}"}
    assert "no heartbeat" in runs.why_lost(stale, now)
    rebooted = {**runs.driver_tags(), "orchard.boot_id": "another-boot", runs.TAG_HEARTBEAT: f"{now - 600:.0f}"}
    assert "no heartbeat" in runs.why_lost(rebooted, now)


def test_runs_without_a_heartbeat_are_never_touched():
    assert runs.why_lost({"mlflow.runName": "someone else's"}) is None


def test_reap_closes_only_lost_runs_and_the_cli_reports_them(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchard.tracking import check_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("lost")
    alive = client.create_run(exp, tags=runs.driver_tags()).info.run_id
    lost = client.create_run(exp, tags={**runs.driver_tags(), "orchard.pid": str(_dead_pid())}).info.run_id
    foreign = client.create_run(exp, tags={}).info.run_id
    listing = subprocess.run([sys.executable, "-m", "orchard", "runs", "list", f"tracking.uri={uri}"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert listing.returncode == 0 and f"{lost}" in listing.stdout and "driver lost" in listing.stdout
    assert f"{alive}" in listing.stdout and socket.gethostname() in listing.stdout
    assert runs.reap(client) == [lost]
    assert client.get_run(lost).info.status == "FAILED"
    assert "driver lost" in client.get_run(lost).data.tags["orchard.error"]
    assert client.get_run(alive).info.status == "RUNNING" and client.get_run(foreign).info.status == "RUNNING"


def test_a_run_is_found_by_a_unique_prefix_of_its_id(tmp_path):
    """``python -m orchard resume <id>`` takes an id shortened as listings show it; too short or
    unknown is one line naming the key."""
    import pytest
    from mlflow.tracking import MlflowClient

    from orchard.errors import ConfigError
    from orchard.runs import find_run_by_prefix

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    made = [client.create_run(exp).info.run_id for _ in range(3)]
    assert find_run_by_prefix(client, made[1][:8], uri).info.run_id == made[1]
    with pytest.raises(ConfigError, match="at least its first 6"):
        find_run_by_prefix(client, made[1][:3], uri)
    unknown = "".join("0" if c != "0" else "1" for c in made[0][:8])  # differs from every id at each place
    with pytest.raises(ConfigError, match="is not one"):
        find_run_by_prefix(client, unknown, uri)
