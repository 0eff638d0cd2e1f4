"""``python -m orchard ui`` (orchard/cli/ui.py): the real MLflow UI started on a real sqlite store,
bound to 127.0.0.1, answering with the run; the printed page is the run's, in the training view;
Ctrl-C stops the server and everything it forked. Bad arguments are one line, exit 2, nothing made."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from orchard.cli.ui import ui_command

from .test_runs import _store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_ui_serves_the_store_on_localhost_opens_the_runs_training_view_and_stops_on_ctrl_c(tmp_path):
    import psutil

    uri, ids = _store(tmp_path)
    port = _free_port()
    ui = subprocess.Popen([sys.executable, "-m", "orchard", "ui", ids["good"][:8], f"tracking.uri={uri}",
                           f"port={port}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any(line.startswith("open:") for line in lines):
            line = ui.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
        opened = next((line for line in lines if line.startswith("open:")), None)
        assert opened, (lines, ui.poll(), ui.stderr.read() if ui.poll() is not None else "")
        client_exp = json.load(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/runs/get?run_id={ids['good']}", timeout=10))
        experiment = client_exp["run"]["info"]["experiment_id"]
        assert opened.split()[-1] == (f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs/{ids['good']}"
                                      "?workflowType=machine_learning")
        listening = {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port}
        assert listening == {"127.0.0.1"}
        # the server and its web worker: no GenAI job runner and its consumers beside them
        served = [" ".join(p.cmdline()) for p in psutil.Process(ui.pid).children(recursive=True)]
        assert not [c for c in served if "jobs" in c or "huey" in c], served
        ui.send_signal(signal.SIGINT)
        assert ui.wait(30) == 0
    finally:
        if ui.poll() is None:
            ui.kill()
    with socket.socket() as s:  # the server and its workers are gone with it (its closed
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections may linger in TIME_WAIT)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_a_store_that_is_not_there_is_one_line_and_none_is_made(tmp_path, capsys):
    assert ui_command([f"tracking.uri=sqlite:///{tmp_path}/none.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("orchard ui: tracking.uri") and not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("arg, says", [("port=http", "port: a TCP port number"), ("colour=red", "colour: tracking.uri or port")])
def test_a_bad_argument_is_one_line_naming_it(tmp_path, capsys, arg, says):
    uri, _ = _store(tmp_path)
    assert ui_command([f"tracking.uri={uri}", arg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"orchard ui: {says}"), err


def test_a_port_that_is_taken_is_named_and_the_default_moves_to_a_free_one(tmp_path, capsys):
    from orchard.cli.ui import _port

    uri, _ = _store(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert ui_command([f"tracking.uri={uri}", f"port={port}"]) == 2
        assert f"{port} is taken" in capsys.readouterr().err
        assert _port(None, port) != port
