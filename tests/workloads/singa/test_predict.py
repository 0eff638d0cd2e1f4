"""singa's trained net as an MLflow pyfunc Model, loaded in a fresh process, and ``mode=predict``
through the CLI on an MNIST IDX pair, a CIFAR-10 batch and a folder of PNGs, one of them not an image."""
from __future__ import annotations

import csv
import pickle

import cv2
import numpy as np
import pytest

from tests.orchard.model_helpers import predict_cli, pyfunc_in_fresh_process


@pytest.fixture(scope="module")
def trained(cli_run):
    run = cli_run("workload=singa", "singa.arch=local")
    assert run.exit_code == 0, run.console[-3000:]
    return run


@pytest.fixture(scope="module")
def digits():
    """Real 8x8 digits as the loader scales them (0..255), with their labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return np.round(d.data * (255.0 / 16.0)).astype(np.uint8), d.target.astype(np.int64)


@pytest.mark.slow
def test_the_logged_net_classifies_digits_in_a_fresh_process(trained, digits, tmp_path):
    x, y = digits
    got = pyfunc_in_fresh_process(trained.uri, f"runs:/{trained.run_id}/model", x[:300], tmp_path)
    assert not got.ray_loaded
    assert got.metadata["orchard_workload"] == "singa" and got.metadata["field"] == "pixel"
    assert got.on_example.shape == (len(got.example), 10)
    assert got.on_file.shape == (300, 10)
    np.testing.assert_allclose(got.on_file.sum(1), 1.0, atol=1e-4)
    assert (got.on_file.argmax(1) == y[:300]).mean() > 0.5   # a smoke-trained MLP, far above chance (0.1)


@pytest.mark.slow
def test_predict_reads_idx_cifar_batches_and_images_and_skips_a_bad_file(trained, digits, tmp_path):
    from workloads.singa.apps.digits import write_idx

    x, y = digits
    folder = tmp_path / "inputs"
    (folder / "3").mkdir(parents=True)
    write_idx(folder / "t10k-images-idx3-ubyte", x[:200].reshape(200, 8, 8))
    write_idx(folder / "t10k-labels-idx1-ubyte", y[:200].astype(np.uint8))
    three = int(np.flatnonzero(y == 3)[0])
    cv2.imwrite(str(folder / "3" / "three.png"), x[three].reshape(8, 8))
    # a CIFAR-10 python batch (as cifar-10-batches-py has them) of 32x32 colour digits
    colour = np.stack([cv2.resize(x[three].reshape(8, 8), (32, 32), interpolation=cv2.INTER_NEAREST)] * 3, 0)
    batch = {b"data": np.stack([colour.reshape(-1)] * 4), b"labels": [3, 3, 3, 3]}
    (folder / "test_batch").write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "bad.png").write_text("a text file named .png")
    result = predict_cli(trained, "singa", f"runs:/{trained.run_id}/model", folder, tmp_path, "singa.arch=local")
    assert result.exit_code == 0, result.console[-3000:]
    assert "Traceback" not in result.console and "skipped bad.png" in result.console
    with open(result.predictions / "predictions.csv") as f:
        rows = {r["file"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"t10k-images-idx3-ubyte", "test_batch", "three.png"}
    assert rows["t10k-images-idx3-ubyte"]["samples"] == "200" and rows["test_batch"]["samples"] == "4"
    assert rows["three.png"]["labelled"] == "1" and 0 < float(rows["three.png"]["confidence"]) <= 1
    with open(result.predictions / "labels" / "t10k-images-idx3-ubyte.csv") as f:
        per_sample = list(csv.DictReader(f))
    assert len(per_sample) == 200 and [int(r["truth"]) for r in per_sample] == y[:200].tolist()
    idx_acc = np.mean([r["label"] == r["truth"] for r in per_sample])
    assert idx_acc > 0.5
    m = result.metrics
    assert m["predict/files"] == 3 and m["predict/skipped"] == 1 and m["predict/samples"] == 205
    assert m["data/skipped_files"] == 1                      # counted by kind too (orchard/tracking/skipped.py)
    correct = sum(int(r["correct"]) for r in rows.values())
    assert m["predict/accuracy"] == pytest.approx(correct / 205)


@pytest.mark.slow
def test_the_net_predicts_on_a_read_only_array_without_a_warning(trained, digits):
    """Arrays from Ray's object store (mode=predict's actors) and from an mmap are read-only:
    the pyfunc copies its chunk rather than have torch warn that writing to it is undefined."""
    import warnings

    import mlflow

    model = mlflow.pyfunc.load_model(str(trained.run_dir / "model"))   # the run's own copy of what it logged
    x = digits[0][:10].copy()
    x.setflags(write=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probabilities = model.predict(x)
    assert probabilities.shape == (10, 10)
    assert not [w for w in caught if "not writable" in str(w.message)], [str(w.message) for w in caught]
