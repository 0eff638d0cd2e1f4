"""A logged model travels (issue 33): downloaded from the store, its environment is built from its
own requirements.txt in a fresh virtualenv (pip's cache or the package registry; no orchard, no
checkout on the path), where it loads and predicts, and ``mlflow models serve --env-manager
local`` answers its serving example on ``/invocations``.  Forest only: building the venv costs
about a minute (2.5 min on a busy 2-core box), and forest's loader is the one with a compiled
dependency (numba).  The other workloads' requirements and code/ are checked in
tests/integration/test_mlflow_ui.py; docs/models.md gives the same commands for any model."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_LOAD = r"""
import importlib.util, json, sys
import mlflow
from mlflow.models import Model
assert importlib.util.find_spec("orchard") is None, "orchard importable"
local = sys.argv[1]
out = mlflow.pyfunc.load_model(local).predict(Model.load(local).load_input_example(local))
print(json.dumps({"shape": list(out.shape), "ray": "ray" in sys.modules}))
"""


def test_the_forest_model_loads_predicts_and_serves_in_a_fresh_venv_from_its_own_requirements(cli_run, tmp_path):
    import mlflow

    run = cli_run("workload=forest")
    assert run.exit_code == 0, run.console[-3000:]
    (output,) = run.run.outputs.model_outputs
    mlflow.set_tracking_uri(run.uri)   # models:/ resolves through MLflow's current store
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{output.model_id}", dst_path=str(tmp_path / "dl")))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"   # the server execs the venv's uvicorn
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-r", str(local / "requirements.txt")],
                         capture_output=True, text=True, timeout=900, env=env)
    assert pip.returncode == 0, pip.stderr[-3000:]
    loaded = subprocess.run([str(venv / "bin" / "python"), "-c", _LOAD, str(local)], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path, env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert got["shape"][0] == 1 and not got["ray"]

    port = _free_port()
    server = subprocess.Popen([str(venv / "bin" / "mlflow"), "models", "serve", "-m", str(local), "--env-manager",
                               "local", "-h", "127.0.0.1", "-p", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(f"http://127.0.0.1:{port}/ping", server)
        body = (local / "serving_input_example.json").read_bytes()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            answer = json.loads(reply.read())
        labels = answer["predictions"]
        assert len(labels) == 1 and len(labels[0]) == got["shape"][1]   # one label image, as tall as the example
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, deadline_s: float = 180.0) -> None:
    """Until ``url`` answers 200 (the server started) or the process ends."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"mlflow models serve exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)   # polling interval while the server starts, not a fixed wait
    raise AssertionError(f"{url} did not answer within {deadline_s:g} s")
