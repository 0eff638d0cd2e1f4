"""singa's data: the ``Dataset`` record every app trains on, the name -> loader registry
(``DATASETS``, ``singa.data``) and ``load_dataset``; the loaders themselves are in apps/.

A dataset is a dict of numpy arrays per split (``train``/``test``), each field with a leading
sample dimension: ``{"pixel": (N, 64) float32, "label": (N,) int64}``.  Data layers of a net
read fields by name (``field: pixel``), so a loader and a net agree on field names only.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

MAX_INPUT_MB = 2048   # singa.max_input_mb's default: the most one input file may hold (MNIST's train images: 45 MiB)


class InputTooLarge(ValueError):
    """An input file over ``singa.max_input_mb`` (its size, or the size its header declares)."""

    kind = "too_large"   # data/skipped_files/too_large where a file is skipped (orchard/tracking/skipped.py)


def check_input_size(path, size: int, max_bytes: int, what: str = "holds") -> None:
    """Raise ``InputTooLarge`` naming the file when ``size`` bytes exceed ``max_bytes``."""
    if size > max_bytes:
        raise InputTooLarge(f"{path} {what} {size:,} bytes, more than singa.max_input_mb="
                            f"{max_bytes / 2**20:.4g} ({max_bytes:,} bytes) allows")


# name -> "module:function(data_dir, seed, smoke) -> Dataset"; a loader that reads files may take
# ``max_bytes`` too (singa.max_input_mb in bytes: the most one of its files may hold)
DATASETS = {
    "digits": "workloads.singa.apps.digits:load_digits_dataset",
    "mnist": "workloads.singa.apps.digits:load_mnist_dataset",
    "digits_rgb": "workloads.singa.apps.cifar:load_digits_rgb_dataset",
    "cifar10": "workloads.singa.apps.cifar:load_cifar_dataset",
    "digits_tags": "workloads.singa.apps.paired:load_digit_tags_dataset",
    "nuswide": "workloads.singa.apps.paired:load_nuswide_dataset",
}


@dataclass
class Dataset:
    name: str
    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    @property
    def num_train(self) -> int:
        return len(next(iter(self.train.values())))

    @property
    def num_test(self) -> int:
        return len(next(iter(self.test.values())))

    def shapes(self) -> dict[str, tuple]:
        """Per-sample shape of each field (what the data layer announces to the net)."""
        return {k: tuple(v.shape[1:]) for k, v in self.train.items()}

    def shard(self, rank: int, world: int) -> "Dataset":
        """The training partition of one worker group (strided, so classes stay balanced)."""
        return Dataset(self.name, {k: v[rank::world] for k, v in self.train.items()}, self.test, self.meta)


def load_dataset(name: str, data_dir: str | None, seed: int, smoke: bool,
                 max_input_mb: float | None = None) -> Dataset:
    """The dataset ``name``; a loader that reads files gets ``max_bytes`` from ``max_input_mb``
    (singa.max_input_mb; None: ``MAX_INPUT_MB``) and refuses a larger file (``InputTooLarge``)."""
    import inspect

    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; one of {', '.join(DATASETS)}")
    module, fn = DATASETS[name].split(":")
    loader = getattr(importlib.import_module(module), fn)
    limits = {}
    if "max_bytes" in inspect.signature(loader).parameters:
        limits["max_bytes"] = round(float(max_input_mb or MAX_INPUT_MB) * 2**20)
    return loader(data_dir, seed, smoke, **limits)


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) with the same class proportions in both."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_test = int(round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return rng.permutation(np.concatenate(train)), np.sort(np.concatenate(test))
