"""The msae app logs an MLflow Model too: its retrieval (image -> tag documents, Fig. 11) as the
prediction, loaded with ``mlflow.pyfunc.load_model`` in a fresh process without Ray."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.orchard.model_helpers import ROOT

_SCRIPT = r"""
import json, sys
import numpy as np
import mlflow
from mlflow.models import Model

uri, model_uri, inputs = sys.argv[1:4]
mlflow.set_tracking_uri(uri)
model = mlflow.pyfunc.load_model(model_uri)
local = mlflow.artifacts.download_artifacts(model_uri)
table = model.predict(np.load(inputs))
print(json.dumps({"ray_loaded": "ray" in sys.modules, "metadata": Model.load(local).metadata,
                  "outputs": [c["name"] for c in Model.load(local).signature.outputs.to_dict()],
                  "rows": table.to_dict("records")}))
"""


@pytest.mark.slow
def test_the_msae_retrieves_both_ways_and_logs_a_model_that_finds_what_the_run_measured(run_orchard, tmp_path):
    """The msae run retrieves better than chance both ways; its model, loaded alone, ranks the
    run's test images against its database of tag documents as the run did: its precision at 10
    is the run's test/precision_at_10_img2txt."""
    from workloads.singa.data import load_dataset

    result = run_orchard("workload=singa", "debug=smoke", "singa.app=msae", "singa.arch=local", "singa.tsne=false",
                         "singa.epochs=15")
    assert result.exit_code == 0, result.outcome
    run, run_id, uri = result.run, result.run.info.run_id, result.client.tracking_uri
    m = run.data.metrics
    # 10 classes: retrieval at chance gives ~0.1
    assert m["test/precision_at_10_img2txt"] > 0.25 and m["test/precision_at_10_txt2img"] > 0.25
    assert run.data.tags["orchard.model_uri"] == f"runs:/{run_id}/model"
    test = load_dataset("digits_tags", None, int(run.data.params["seed"]), True).test   # the run's test pairs
    np.save(tmp_path / "images.npy", test["image"])
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, uri, f"runs:/{run_id}/model",
                           str(tmp_path / "images.npy")], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["ray_loaded"]
    assert got["metadata"]["orchard_workload"] == "singa" and got["metadata"]["kind"] == "retrieval"
    assert got["outputs"] == ["query", "rank", "document", "distance", "label", "tags"]
    rows, n = got["rows"], len(test["image"])
    assert len(rows) == n * 10 and {r["rank"] for r in rows} == set(range(10))    # 10 documents per image
    for q in (0, n // 2, n - 1):
        mine = [r for r in rows if r["query"] == q]
        assert [r["distance"] for r in mine] == sorted(r["distance"] for r in mine)  # nearest first
    assert all(r["tags"] for r in rows)                                            # each document's words
    precision = np.mean([r["label"] == test["label"][r["query"]] for r in rows])
    assert precision == pytest.approx(m["test/precision_at_10_img2txt"], abs=0.01)
