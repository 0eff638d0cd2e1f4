"""What the predict tests of the four workloads share: a logged model loaded with
``mlflow.pyfunc.load_model`` in a fresh Python process, and ``mode=predict`` through the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.session_ray import attach_overrides

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, sys
import numpy as np
import mlflow
from mlflow.models import Model

uri, model_uri, inputs, out = sys.argv[1:5]
mlflow.set_tracking_uri(uri)
model = mlflow.pyfunc.load_model(model_uri)
local = mlflow.artifacts.download_artifacts(model_uri)
example = Model.load(local).load_input_example(local)
on_example = np.asarray(model.predict(example))
on_file = np.asarray(model.predict(np.load(inputs)))
np.savez(out, example=np.asarray(example), on_example=on_example, on_file=on_file)
print(json.dumps({"ray_loaded": "ray" in sys.modules, "flavors": sorted(Model.load(local).flavors),
                  "metadata": Model.load(local).metadata}))
"""


@dataclass
class FreshPyfunc:
    example: np.ndarray      # the model's logged input example
    on_example: np.ndarray   # its prediction on that
    on_file: np.ndarray      # its prediction on the test's inputs
    ray_loaded: bool         # whether loading or predicting imported Ray
    flavors: list
    metadata: dict


def pyfunc_in_fresh_process(tracking_uri: str, model_uri: str, inputs: np.ndarray, tmp_path: Path) -> FreshPyfunc:
    """``mlflow.pyfunc.load_model(model_uri).predict(...)`` in a new Python process (no Ray
    started), on the model's input example and on ``inputs``."""
    np.save(tmp_path / "inputs.npy", inputs)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, tracking_uri, model_uri, str(tmp_path / "inputs.npy"),
                           str(tmp_path / "outputs.npz")], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    with np.load(tmp_path / "outputs.npz", allow_pickle=False) as data:
        return FreshPyfunc(data["example"], data["on_example"], data["on_file"], info["ray_loaded"],
                           info["flavors"], info["metadata"])


@dataclass
class PredictRun:
    exit_code: int
    console: str
    run: object              # mlflow.entities.Run, or None when no run was opened
    client: object

    @property
    def metrics(self) -> dict:
        return self.run.data.metrics

    @property
    def predictions(self) -> Path:
        return Path(self.run.data.tags["orchard.run_dir"]) / "predictions"

    def artifacts(self, path: str | None = None) -> list[str]:
        return [a.path for a in self.client.list_artifacts(self.run.info.run_id, path)]


def predict_cli(trained, workload: str, model: str, input_path: Path, tmp_path: Path, *extra: str) -> PredictRun:
    """``python -m orchard workload=<w> mode=predict model=... input=...`` on the trained run's
    store, as a user runs it."""
    from mlflow.tracking import MlflowClient

    import uuid

    tmp_path.mkdir(parents=True, exist_ok=True)
    name = f"predict-{workload}-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run([sys.executable, "-m", "orchard", f"workload={workload}", "mode=predict", f"model={model}",
                           f"input={input_path}", f"run_name={name}", f"tracking.uri={trained.uri}",
                           f"output_dir={tmp_path}/out", *attach_overrides(), *extra],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    client = MlflowClient(trained.uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(exps, f"tags.mlflow.runName = '{name}'") if exps else []
    return PredictRun(proc.returncode, proc.stdout + proc.stderr, found[0] if found else None, client)
