"""Data loaders of the apps on small files written in the real formats, and the metrics."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from workloads.singa.apps.cifar import read_cifar_batch
from workloads.singa.apps.digits import read_idx, write_idx
from workloads.singa.data import load_dataset
from workloads.singa.evaluate import mean_average_precision, neighbourhood_purity, precision_at_k


def write_mnist(folder, n_train=30, n_test=12, gz=False):
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    arrays = {}
    for stem, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        write_idx(folder / f"{stem}-images-idx3-ubyte{suffix}", images)
        write_idx(folder / f"{stem}-labels-idx1-ubyte{suffix}", labels)
        arrays[stem] = (images, labels)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_files_load_with_shapes_and_values(tmp_path, gz):
    arrays = write_mnist(tmp_path, gz=gz)
    data = load_dataset("mnist", str(tmp_path), seed=0, smoke=False)
    assert data.shapes() == {"pixel": (784,), "label": ()}
    np.testing.assert_array_equal(data.train["pixel"], arrays["train"][0].reshape(30, 784))
    np.testing.assert_array_equal(data.test["label"], arrays["t10k"][1])
    assert data.meta["image_hw"] == (28, 28)


def test_idx_reader_rejects_truncated_files(tmp_path):
    write_idx(tmp_path / "x", np.zeros((4, 3), np.uint8))
    raw = (tmp_path / "x").read_bytes()
    (tmp_path / "x").write_bytes(raw[:-2])
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "x")


def test_a_gzip_bomb_idx_file_is_refused_without_decompressing_it_whole(tmp_path):
    """The reader is bounded by the header's declared size: a file declaring more than the bound is
    refused from its header; one whose data run past what it declares (a few MB of zeros behind a
    4x3 header, ~6 kB gzipped) is refused after reading one byte past the declared size."""
    import gzip
    import struct

    header = struct.pack(">HBB", 0, 0x08, 2) + struct.pack(">2I", 4, 3)
    with gzip.open(tmp_path / "bomb-idx3-ubyte.gz", "wb") as f:
        f.write(header + bytes(12) + bytes(8 * 2**20))
    assert (tmp_path / "bomb-idx3-ubyte.gz").stat().st_size < 64 * 2**10
    with pytest.raises(ValueError, match="holds more than 12 bytes"):
        read_idx(tmp_path / "bomb-idx3-ubyte.gz")
    write_idx(tmp_path / "big-idx3-ubyte.gz", np.zeros((40, 30), np.uint8))
    with pytest.raises(ValueError, match="declares 1,200 bytes, more than singa.max_input_mb=.* .1,000 bytes. allows"):
        read_idx(tmp_path / "big-idx3-ubyte.gz", max_bytes=1000)
    assert read_idx(tmp_path / "big-idx3-ubyte.gz", max_bytes=1200).shape == (40, 30)


def write_cifar(folder, batches=2, n=20):
    rng = np.random.default_rng(1)
    for name in [f"data_batch_{i + 1}" for i in range(batches)] + ["test_batch"]:
        batch = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, n).tolist(),
                 b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"filenames": [f"img{i}.png".encode() for i in range(n)]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)


def test_cifar_python_batches_load(tmp_path):
    write_cifar(tmp_path)
    data = load_dataset("cifar10", str(tmp_path), seed=0, smoke=False)
    assert data.train["image"].shape == (40, 3, 32, 32) and data.train["image"].dtype == np.uint8
    images, labels = read_cifar_batch(tmp_path / "test_batch")
    np.testing.assert_array_equal(data.test["image"], images)
    assert len(labels) == 20


def test_cnn_app_trains_on_cifar_python_batches(tmp_path, compose):
    """SINGA's CIFAR-10 example net (conv-relu-pool-LRN x3, inner product) on files in the real
    format: it validates, builds and takes a step; its target is the paper's CIFAR-10 figure."""
    import workloads.singa as singa
    from orchard.config import validate
    from workloads.singa.settings import group_spec, load_net, resolve_arch, resolve_training
    from workloads.singa.worker_group import WorkerGroup

    write_cifar(tmp_path)
    cfg = compose("workload=singa", "singa.app=cnn", "singa.data=cifar10", f"singa.data_dir={tmp_path}",
                  "singa.arch=local", "singa.batch_size=8")
    validate(cfg, singa)
    app = load_net(cfg)
    train = resolve_training(cfg, app)
    assert train["target_accuracy"] == 0.80
    assert resolve_training(compose("workload=singa", "singa.app=cnn"), app)["target_accuracy"] == 0.55
    group = WorkerGroup(group_spec(cfg, app, train, resolve_arch(cfg)))
    before = group.get_params()["conv1/weight"].copy()
    metrics = group.local_step()
    assert np.isfinite(metrics["loss/loss"]) and not np.allclose(group.get_params()["conv1/weight"], before)
    assert group.evaluate()["loss/accuracy"] >= 0.0 and group.num_train == 40


class Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


def test_cifar_loader_refuses_pickles_that_run_code(tmp_path):
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": [1]}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        read_cifar_batch(tmp_path / "test_batch")


def test_default_cnn_data_is_cifar_shaped_real_digits():
    data = load_dataset("digits_rgb", None, seed=0, smoke=True)
    assert data.train["image"].shape == (600, 3, 32, 32) and data.test["image"].shape == (200, 3, 32, 32)
    assert set(np.unique(data.train["label"])) == set(range(10))
    assert data.train["image"].std() > 20  # coloured renders, not blank canvases


def test_digit_tag_pairs_describe_their_class():
    data = load_dataset("digits_tags", None, seed=0, smoke=False)
    vocab = data.meta["vocabulary"]
    sevens = data.train["text"][data.train["label"] == 7]
    assert sevens[:, vocab.index("seven")].mean() > 0.3 and sevens[:, vocab.index("zero")].mean() < 0.1
    assert data.train["image"].max() <= 1.0 and data.train["text"].shape[1] == len(vocab)


def test_nuswide_layout_loads(tmp_path):
    rng = np.random.default_rng(0)
    np.savetxt(tmp_path / "image_features.txt", rng.random((10, 5)))
    np.savetxt(tmp_path / "tags.txt", rng.integers(0, 2, (10, 7)), fmt="%d")
    np.savetxt(tmp_path / "labels.txt", rng.integers(0, 2, (10, 3)), fmt="%d")
    (tmp_path / "split.txt").write_text("\n".join(["train"] * 7 + ["test"] * 3))
    data = load_dataset("nuswide", str(tmp_path), seed=0, smoke=False)
    assert data.num_train == 7 and data.num_test == 3
    assert data.shapes() == {"image": (5,), "text": (7,), "label": (3,)}


@pytest.mark.slow
def test_retrieval_precision_and_purity_on_known_geometry():
    labels = np.array([0, 0, 1, 1])
    aligned = np.array([[0.0], [0.1], [5.0], [5.1]])
    assert precision_at_k(aligned, aligned, labels, labels, k=2) == 1.0
    shuffled = aligned[[2, 3, 0, 1]]
    assert precision_at_k(aligned, shuffled, labels, labels, k=2) == 0.0
    assert mean_average_precision(aligned, aligned, labels, labels, k=2) == 1.0
    assert neighbourhood_purity(aligned, labels, k=1) == 1.0
    # multi-label relevance: a shared concept counts
    concepts = np.array([[1, 0], [1, 1], [0, 1], [0, 1]])
    assert precision_at_k(aligned[:1], aligned, concepts[:1], concepts, k=2) == 1.0


def test_singa_max_input_mb_bounds_every_input_file_and_is_checked_before_a_run(tmp_path, compose):
    """``singa.max_input_mb``: an IDX file declaring more, a CIFAR batch or a NUS-WIDE table
    holding more, is refused naming the file and the key; the net's check (``check``, while Ray
    starts) says so in one line before a run opens, and the key itself must be a positive number
    (``validate``, before Ray starts)."""
    import workloads.singa as singa
    from orchard.config import check, validate
    from orchard.errors import ConfigError
    from workloads.singa.data import InputTooLarge

    write_mnist(tmp_path)   # 30 x 28 x 28 = 23,520 bytes of training images
    assert load_dataset("mnist", str(tmp_path), 0, False, max_input_mb=0.1).num_train == 30
    with pytest.raises(InputTooLarge, match=r"train-images-idx3-ubyte declares 23,520 bytes, more than singa.max_input_mb=0\.01 "):
        load_dataset("mnist", str(tmp_path), 0, False, max_input_mb=0.01)
    cifar = tmp_path / "cifar"
    cifar.mkdir()
    write_cifar(cifar)
    with pytest.raises(InputTooLarge, match="data_batch_1 holds"):
        load_dataset("cifar10", str(cifar), 0, False, max_input_mb=0.01)
    mnist = ["workload=singa", "singa.app=mlp", "singa.data=mnist", f"singa.data_dir={tmp_path}", "debug=smoke"]
    cfg = compose(*mnist, "singa.max_input_mb=0.01")
    validate(cfg, singa)
    with pytest.raises(ConfigError) as err:
        check(cfg, singa)
    assert err.value.key == "singa.max_input_mb" and "train-images-idx3-ubyte declares 23,520 bytes" in str(err.value)
    for bad in ("0", "abc"):
        with pytest.raises(ConfigError) as err:
            validate(compose(*mnist, f"singa.max_input_mb={bad}"), singa)
        assert err.value.key == "singa.max_input_mb"
