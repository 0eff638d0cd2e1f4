"""A logged model travels (issue 33): downloaded from the store, its environment is built from its
own requirements.txt in a fresh virtualenv (uv's cache or the package registry; no orchard, no
checkout on the path), where it loads, predicts and answers its serving example through the
function ``mlflow models serve`` answers ``/invocations`` with: every workload's model, from the
session's shared smoke runs; the forest's and one torch model are also served over HTTP
(``mlflow models serve --env-manager local``).  The venvs are built with uv (as MLflow's ``env_manager="uv"``
builds a model's environment): pip took 58 s for torch's requirements on 2 cores, uv 12 s with
its cache empty and 3 s once filled. The three torch models still share one, built up from their
own requirements one model at a time. docs/models.md gives the same commands for any model."""
from __future__ import annotations

import functools
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

from tests.integration.test_console import SMOKE

pytestmark = pytest.mark.slow

_LOAD = r"""
import importlib.util, json, sys
import mlflow
from mlflow.models import Model
assert importlib.util.find_spec("orchard") is None, "orchard importable"
local = sys.argv[1]
model = mlflow.pyfunc.load_model(local)
out = model.predict(Model.load(local).load_input_example(local))
# the serving example through the function `mlflow models serve` answers /invocations with
from mlflow.pyfunc.scoring_server import invocations
with open(local + "/serving_input_example.json") as f:
    answer = invocations(f.read(), "application/json", model, model.metadata.get_input_schema())
assert answer.status == 200, answer.response
print(json.dumps({"shape": list(out.shape), "ray": "ray" in sys.modules,
                  "predictions": json.loads(answer.response)["predictions"]}))
"""


def test_the_forest_model_loads_predicts_and_serves_in_a_fresh_venv_from_its_own_requirements(cli_run, tmp_path):
    local = _download_model(cli_run(*SMOKE["forest"]), tmp_path / "dl")
    venv, env = _fresh_venv(tmp_path / "venv")
    _install_requirements(venv, env, local)
    got = _load_and_serve(venv, env, local, tmp_path)
    assert len(got["predictions"]) == 1 and len(got["predictions"][0]) == got["shape"][1]  # one label image, as tall as the example


def test_the_torch_models_load_predict_and_serve_in_one_venv_built_from_their_own_requirements(cli_run, tmp_path):
    """flower, singa and video in one venv, so torch is installed once: their requirements nest
    (each file is a subset of the next), each model's own requirements are installed just before it
    is served, and a model is served before any later file adds to the venv: what each model meets
    is exactly what its own requirements.txt brings, so an undeclared import still fails."""
    locals_ = {w: _download_model(cli_run(*SMOKE[w]), tmp_path / w) for w in ("flower", "singa", "video")}
    pins = {w: set((local / "requirements.txt").read_text().split()) for w, local in locals_.items()}
    order = sorted(locals_, key=lambda w: len(pins[w]))
    for smaller, larger in zip(order, order[1:]):
        assert pins[smaller] <= pins[larger], f"{smaller}'s requirements are not inside {larger}'s: give it a venv of its own"
    venv, env = _fresh_venv(tmp_path / "venv")
    for workload in order:
        _install_requirements(venv, env, locals_[workload])
        # every model answers its serving example as the server would (scoring_server.invocations);
        # one, the last, over HTTP from `mlflow models serve` too: the server is the same for all
        # three (a server start is ~20 s of CI's slower machine)
        got = _load_and_serve(venv, env, locals_[workload], tmp_path / workload, serve=workload == order[-1])
        example = json.loads((locals_[workload] / "serving_input_example.json").read_text())["inputs"]
        assert got["shape"][0] == len(example) and len(got["predictions"]) == len(example), (workload, got)


def _download_model(run, dst: Path) -> Path:
    """The run's logged model, downloaded from its store as a user's ``models:/`` URI gives it."""
    import mlflow

    assert run.exit_code == 0, run.console[-3000:]
    (output,) = run.run.outputs.model_outputs
    mlflow.set_tracking_uri(run.uri)   # models:/ resolves through MLflow's current store
    return Path(mlflow.artifacts.download_artifacts(f"models:/{output.model_id}", dst_path=str(dst)))


def _fresh_venv(venv: Path) -> tuple[Path, dict]:
    """An empty venv of this Python (uv's, no pip in it), and the environment its processes get:
    no PYTHONPATH (no checkout), the venv's bin first (the server execs the venv's uvicorn)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    subprocess.run([sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, str(venv)],
                   check=True, timeout=300, env=env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv, env


def _install_requirements(venv: Path, env: dict, local: Path) -> None:
    """The model's requirements.txt into ``venv``, from the places pip is configured to look too
    (find-links: where this machine keeps its CPU torch wheel) and the package index."""
    links = [arg for link in _pip_find_links() for arg in ("--find-links", link)]
    uv = subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                         *links, "-r", str(local / "requirements.txt")],
                        capture_output=True, text=True, timeout=900, env=env)
    assert uv.returncode == 0, uv.stderr[-3000:]


@functools.cache
def _pip_find_links() -> tuple[str, ...]:
    """pip's find-links (PIP_FIND_LINKS, else pip's config files), which uv does not read."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    if not found:
        config = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                                capture_output=True, text=True, timeout=60)
        found = config.stdout.split() if config.returncode == 0 else []
    return tuple(found)


def _load_and_serve(venv: Path, env: dict, local: Path, cwd: Path, serve: bool = True) -> dict:
    """Load the model in the venv without orchard, predict its input example and answer its
    serving example through MLflow's scoring function; then (``serve``) serve it with ``mlflow
    models serve --env-manager local`` and post the serving example to /invocations. Returns the
    loaded prediction's shape and the predictions (the server's where it served)."""
    cwd.mkdir(parents=True, exist_ok=True)
    loaded = subprocess.run([str(venv / "bin" / "python"), "-c", _LOAD, str(local)], capture_output=True, text=True,
                            timeout=600, cwd=cwd, env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert not got["ray"]
    if not serve:
        return got
    port = _free_port()
    server = subprocess.Popen([str(venv / "bin" / "mlflow"), "models", "serve", "-m", str(local), "--env-manager",
                               "local", "-h", "127.0.0.1", "-p", str(port)], cwd=cwd, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(f"http://127.0.0.1:{port}/ping", server)
        body = (local / "serving_input_example.json").read_bytes()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            return {**got, "predictions": json.loads(reply.read())["predictions"]}
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
