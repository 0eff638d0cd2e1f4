"""workloads/singa/data.py: ``singa.data=mnist`` on the standard IDX files (written here: real scikit-learn digits drawn
at MNIST's 28x28, the train images gzipped), with the data partition logged beside the accuracy,
and two architectures compared in the second run's ``figures/architectures.png``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchard.tracking import bookkeeping
from workloads.singa.apps.digits import write_idx


def write_digits_as_mnist(folder, n_train=1000, n_test=300):
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # 8x8 at 0..16 -> 24x24 at 0..255, centred in 28x28 as MNIST centres its digits
    images = np.kron(np.round(bunch.images * (255 / 16)), np.ones((3, 3)))
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))).astype(np.uint8)
    order = np.random.default_rng(0).permutation(len(images))
    train, test = order[:n_train], order[n_train:n_train + n_test]
    write_idx(folder / "train-images-idx3-ubyte.gz", images[train])
    write_idx(folder / "train-labels-idx1-ubyte.gz", bunch.target[train].astype(np.uint8))
    write_idx(folder / "t10k-images-idx3-ubyte", images[test])
    write_idx(folder / "t10k-labels-idx1-ubyte", bunch.target[test].astype(np.uint8))


@pytest.mark.slow
def test_mlp_trains_on_mnist_idx_files_and_the_architectures_are_compared(run_orchard, tmp_path):
    write_digits_as_mnist(tmp_path)
    runs = {arch: run_orchard("workload=singa", "debug=smoke", "singa.data=mnist", f"singa.data_dir={tmp_path}",
                              f"singa.arch={arch}", "singa.epochs=3", "singa.tsne=false")
            for arch in ("local", "sync_ps")}
    for arch, result in runs.items():
        assert result.exit_code == 0, result.outcome
        m, params = result.run.data.metrics, result.run.data.params
        assert m["test/accuracy"] > 0.5  # 10 classes: chance is 0.1
        # the partition of the data behind that accuracy: all 1000 train images, split per group
        book = bookkeeping.read(result.client, result.run.info.run_id)   # sizes: bookkeeping, no charts
        assert book["data/train_samples"] == 1000 and book["data/test_samples"] == 300
        shares = "1000 = 1000" if arch == "local" else "1000 = 500+500"
        assert params["singa.data_partition"].startswith(f"mnist: train {shares} ") and "test 300" in params[
            "singa.data_partition"]
    # the second run drew both architectures: time to target and bytes moved per step
    second = runs["sync_ps"]
    assert "figures/architectures.png" in second.artifacts("figures")
    path = second.client.download_artifacts(second.run.info.run_id, "tables/architectures.json", str(tmp_path))
    rows = {r["label"]: r for r in json.loads(Path(path).read_text())["rows"]}
    assert set(rows) == {"local", "sync_ps"}
    assert rows["local"]["run_id"] == runs["local"].run.info.run_id
    assert rows["local"]["wire/bytes_per_step"] == 0 and rows["sync_ps"]["wire/bytes_per_step"] > 1e6


def test_the_digits_are_read_as_scikit_learn_loads_them_without_importing_its_datasets():
    """The shipped file read directly is exactly ``load_digits`` (images and labels), and reading
    it imports no ``sklearn.datasets`` (a subprocess: this session imported it already)."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from workloads.singa.apps.digits import sklearn_digits

    images, labels = sklearn_digits()
    bunch = load_digits()
    assert images.shape == (1797, 8, 8) and np.array_equal(images, bunch.images)
    assert labels.dtype == np.int64 and np.array_equal(labels, bunch.target)
    probe = ("import sys; from workloads.singa.apps.digits import sklearn_digits; sklearn_digits(); "
             "print('sklearn.datasets' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[3]).stdout.strip() == "False"
