"""The msae app logs an MLflow Model too: its retrieval (image -> tag documents, Fig. 11) as the
prediction, loaded with ``mlflow.pyfunc.load_model`` in a fresh process without Ray, and applied
by ``mode=predict`` to files of query images (.npy, .npz) as the pyfunc applies it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
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
def test_the_msae_retrieves_both_ways_and_logs_a_model_that_finds_what_the_run_measured(run_orchard, tmp_path,
                                                                                       capsys):
    """The msae run retrieves better than chance both ways; its model, loaded alone, ranks the
    run's test images against its database of tag documents as the run did: its precision at 10
    is the run's test/precision_at_10_img2txt.  ``mode=predict`` with that model over a .npy and
    an .npz of the same images retrieves what the pyfunc did, and skips a file of text vectors
    with one line saying what a query file may be (the same run: CI trains the msae once)."""
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

    # mode=predict over files (issue 33): the pyfunc's table per file, in predictions/retrieved/
    queries = tmp_path / "queries"
    queries.mkdir()
    np.save(queries / "some.npy", test["image"][:5])                                   # test images 0..4
    np.savez(queries / "labelled.npz", image=test["image"][5:12], label=test["label"][5:12])   # 5..11
    np.save(queries / "bad.npy", test["text"][:3])    # the documents' side: not what the model takes
    capsys.readouterr()
    predicted = run_orchard("workload=singa", "mode=predict", f"model=runs:/{run_id}/model", f"input={queries}",
                            "singa.arch=local")
    console = "".join(capsys.readouterr())
    assert predicted.exit_code == 0, predicted.outcome
    assert "Traceback" not in console
    assert (f"skipped bad.npy: holds an array of shape (3, {test['text'].shape[1]}); allowed: .npy of images "
            "(N, 64), or .npz with `image` (N, 64)") in console
    assert "predicted: 2 files" in console and "1 skipped" in console and "queries 12" in console
    pm = predicted.run.data.metrics
    assert pm["predict/files"] == 2 and pm["predict/skipped"] == 1 and pm["predict/queries"] == 12
    assert pm["data/skipped_files/not_queries"] == 1                                         # counted by kind
    out = Path(predicted.run.data.tags["orchard.run_dir"]) / "predictions"
    by_file = {r["file"]: r for r in pd.read_csv(out / "predictions.csv").to_dict("records")}
    assert set(by_file) == {"some.npy", "labelled.npz"} and by_file["labelled.npz"]["labelled"] == 7
    assert pd.read_csv(out / "skipped.csv")["file"].tolist() == ["bad.npy"]
    for name, first, count in (("some.npy", 0, 5), ("labelled.npz", 5, 7)):
        table = pd.read_csv(out / "retrieved" / f"{name}.csv", keep_default_na=False).to_dict("records")
        mine = [r for r in rows if first <= r["query"] < first + count]    # the pyfunc's, in the fresh process
        assert len(table) == len(mine) == count * 10
        for written, fresh in zip(table, mine):
            assert written["query"] + first == fresh["query"]
            assert {k: written[k] for k in ("rank", "document", "label", "tags")} == \
                {k: fresh[k] for k in ("rank", "document", "label", "tags")}
            assert written["distance"] == pytest.approx(fresh["distance"], rel=1e-4, abs=1e-5)
    labelled = [r for r in rows if 5 <= r["query"] < 12]
    assert pm["predict/precision_at_10"] == pytest.approx(np.mean([r["label"] == test["label"][r["query"]]
                                                                   for r in labelled]))
