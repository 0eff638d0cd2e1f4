"""Lost runs: who drives a run, when it counts as lost, and the reaper on a real sqlite store."""
import os
import socket
import subprocess
import sys
import time

import pytest

from orchard.cli.runs import runs_command
from orchard.tracking import lost_runs as runs


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


@pytest.mark.slow
def test_reap_closes_only_lost_runs_and_the_cli_reports_them(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from orchard.tracking.store import check_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)
    assert runs_command(["list", f"tracking.uri={uri}"]) == 0  # `runs list` on a store with no run says so
    assert capsys.readouterr().out.startswith(f"orchard: no runs in {uri}")
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
    from orchard.tracking.lost_runs import find_run_by_prefix

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


def _store(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchard.tracking.store import check_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)
    client = MlflowClient(uri)
    return client, client.create_experiment("beats")


def _wait_for(condition, what: str, limit_s: float = 60.0):
    """Poll until ``condition()`` is true; the limit only guards against a hang."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def _counting_offset(monkeypatch, offset_s: float) -> list:
    """Make the store's clock ``offset_s`` from ours; the list grows by one per beat (one
    measurement per beat), so a test can wait for beats instead of sleeping."""
    calls = []

    def offset(uri):
        calls.append(uri)
        return offset_s

    monkeypatch.setattr(runs, "store_clock_offset", offset)
    return calls


def test_a_heartbeat_recent_on_the_stores_clock_is_not_reaped_whatever_our_clock_says(tmp_path, monkeypatch):
    """The store's clock is 1000 s behind this host's: a live run on another host beats on the
    store's clock and is not reaped, though by this host's clock its heartbeat is 1000 s old."""
    client, exp = _store(tmp_path)
    beats = _counting_offset(monkeypatch, -1000.0)
    remote = {**runs.driver_tags(), "orchard.host": "elsewhere"}
    live = client.create_run(exp, tags=remote).info.run_id
    heartbeat = runs.Heartbeat(client, live, interval_s=3600)
    try:
        _wait_for(lambda: client.get_run(live).data.tags.get(runs.TAG_CLOCK_SKEW) == "-1000", "the first beat")
        tags = client.get_run(live).data.tags
        assert "no heartbeat" in runs.why_lost(tags, time.time())  # what a reaper on its own clock would do
        gone = client.create_run(exp, tags={**remote, runs.TAG_HEARTBEAT:
                                            f"{time.time() - 1000 - runs.LOST_AFTER_S - 5:.0f}"}).info.run_id
        assert runs.reap(client) == [gone]
        assert client.get_run(live).info.status == "RUNNING"
    finally:
        heartbeat.stop()
    assert beats  # the heartbeat and the reaper both asked the store for its clock


def test_another_pid_namespace_is_judged_by_its_heartbeat_not_its_pid(tmp_path):
    """A container sharing this machine's host name and boot id: its pid means nothing here."""
    client, exp = _store(tmp_path)
    other_ns = {**runs.driver_tags(), "orchard.pid_ns": "4026530000", "orchard.pid": str(_dead_pid())}
    assert runs.why_lost(other_ns) is None  # a pid that is gone *here*, a fresh heartbeat
    now = time.time()
    assert "no heartbeat" in runs.why_lost({**other_ns, runs.TAG_HEARTBEAT: f"{now - runs.LOST_AFTER_S - 5:.0f}"}, now)
    alive_elsewhere = client.create_run(exp, tags=other_ns).info.run_id
    assert runs.reap(client) == []
    assert client.get_run(alive_elsewhere).info.status == "RUNNING"
    assert runs.driver_tags()["orchard.pid_ns"] == str(os.stat("/proc/self/ns/pid").st_ino)


def test_a_live_run_closed_as_driver_lost_is_reopened_by_its_next_beat(tmp_path, monkeypatch):
    client, exp = _store(tmp_path)
    beats = _counting_offset(monkeypatch, 0.0)
    run_id = client.create_run(exp, tags=runs.driver_tags()).info.run_id
    heartbeat = runs.Heartbeat(client, run_id, interval_s=0.1)
    try:
        _wait_for(lambda: len(beats) >= 1, "the first beat")
        # what a reaper does to a run it misjudged (a stall past the bound on another host)
        client.set_tag(run_id, runs.TAG_ERROR, runs.LOST_REASON + "; no heartbeat for over 120 s")
        client.set_terminated(run_id, status="FAILED")
        _wait_for(lambda: client.get_run(run_id).info.status == "RUNNING", "the run reopened")
        tags = client.get_run(run_id).data.tags
        assert runs.TAG_ERROR not in tags and runs.TAG_REOPENED in tags
        # closed for another reason (a sweep's scheduler, the user): left closed
        client.set_tag(run_id, runs.TAG_ERROR, "stopped early by ASHA")
        client.set_terminated(run_id, status="KILLED")
        seen = len(beats)
        _wait_for(lambda: len(beats) >= seen + 3, "three more beats")
        assert client.get_run(run_id).info.status == "KILLED"
    finally:
        heartbeat.stop()


def test_a_run_reaped_since_its_last_beat_closes_with_its_true_status(tmp_path, monkeypatch):
    """stop() comes before the driver's close: it reopens a run reaped by mistake, so the close
    records FINISHED without a stale "driver lost"."""
    from orchard.tracking.mlflow_run import TrackedRun, close_run

    client, exp = _store(tmp_path)
    beats = _counting_offset(monkeypatch, 0.0)
    run_id = client.create_run(exp, tags=runs.driver_tags()).info.run_id
    heartbeat = runs.Heartbeat(client, run_id, interval_s=3600)
    _wait_for(lambda: len(beats) >= 1, "the first beat")
    client.set_tag(run_id, runs.TAG_ERROR, runs.LOST_REASON)
    client.set_terminated(run_id, status="FAILED")
    heartbeat.stop()
    close_run(TrackedRun(run_id, exp, client.tracking_uri), "FINISHED")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and runs.TAG_ERROR not in run.data.tags


def test_runs_list_never_creates_a_store(tmp_path):
    listing = subprocess.run([sys.executable, "-m", "orchard", "runs", "list"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert listing.returncode == 2 and "tracking.uri" in listing.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_the_stores_clock_is_read_from_an_mlflow_servers_date_header():
    """A server whose clock is 1000 s behind ours (the header of any answer, a 401 too)."""
    import threading
    from email.utils import formatdate
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Skewed(BaseHTTPRequestHandler):
        def date_time_string(self, timestamp=None):
            return formatdate(time.time() - 1000, usegmt=True)

        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 401)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Skewed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        assert -1002 < runs.store_clock_offset(uri) < -998
        assert -1002 < runs.store_clock_offset(uri + "/behind-a-login") < -998
        assert runs.store_clock_offset("sqlite:////tmp/mlflow.db") == 0.0
    finally:
        server.shutdown()
        server.server_close()
