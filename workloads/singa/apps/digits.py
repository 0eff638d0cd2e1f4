"""Handwritten digits (4.1): scikit-learn's 8x8 digits by default, MNIST IDX files when given.

IDX format (LeCun): big-endian magic ``0x0000 08 <ndim>``, the dims as uint32, then uint8 data.
Files may be gzipped (``train-images-idx3-ubyte.gz``).
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from ..data import check_input_size, Dataset, MAX_INPUT_MB, stratified_split

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 8x8 digits: (images (N, 8, 8) float64 at 0..16, labels (N,) int64),
    as ``sklearn.datasets.load_digits`` gives them.

    Read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``, what
    ``load_digits`` reads) without importing ``sklearn.datasets``: that import (SciPy and most of
    scikit-learn) took 1.5 s of every singa run's configuration check on 2 cores, before Ray
    starts, for a 0.03 s file. An install without that file falls back to ``load_digits``."""
    import gzip
    from importlib.util import find_spec

    spec = find_spec("sklearn")   # finds the package without importing it
    shipped = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if shipped is not None and shipped.is_file():
        with gzip.open(shipped, "rt", encoding="utf-8") as f:
            table = np.loadtxt(f, delimiter=",")
        return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target.astype(np.int64)


def load_digits_dataset(data_dir, seed: int, smoke: bool) -> Dataset:
    """1797 real 8x8 digits (pixel 0..16), 80/20 stratified split.  ``pixel`` (N, 64) uint8
    scaled to 0..255 so the same ``mnist`` parser layer (x/255) serves digits and MNIST."""
    images, labels = sklearn_digits()
    pixels = np.round(images.reshape(len(images), -1) * (255.0 / 16.0)).astype(np.uint8)
    train, test = stratified_split(labels, 0.2, seed)
    return Dataset("digits", {"pixel": pixels[train], "label": labels[train]},
                   {"pixel": pixels[test], "label": labels[test]}, {"num_classes": 10, "image_hw": (8, 8)})


MAX_IDX_BYTES = MAX_INPUT_MB * 2**20   # the largest data an IDX file may declare (singa.max_input_mb)


def read_idx(path: str | Path, max_bytes: int = MAX_IDX_BYTES) -> np.ndarray:
    """Read one IDX file (optionally .gz) into a uint8 array of its stated shape.

    Bounded by the declared size: the header is read first, a file declaring more than
    ``max_bytes`` is refused, and at most the declared size (+1 byte, to see a file that holds
    more) is decompressed, so a gzip bomb costs no more memory than an honest file of its header."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        magic = f.read(4)
        if len(magic) < 4:
            raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {magic.hex()})")
        zero, dtype_code, ndim = struct.unpack(">HBB", magic)
        if zero != 0 or dtype_code != 0x08:
            raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {magic.hex()})")
        header = f.read(4 * ndim)
        if len(header) < 4 * ndim:
            raise ValueError(f"{path}: header cut short ({len(header)} of {4 * ndim} bytes of dimensions)")
        dims = struct.unpack(f">{ndim}I", header)
        declared = int(np.prod(dims, dtype=np.int64))
        check_input_size(path, declared, max_bytes, "declares")   # refused from its header, nothing decompressed
        raw = f.read(declared + 1)
    if len(raw) != declared:
        held = f"more than {declared:,}" if len(raw) > declared else f"{len(raw):,}"
        raise ValueError(f"{path}: header says {dims}, file holds {held} bytes of data")
    return np.frombuffer(raw, dtype=np.uint8).reshape(dims)


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (what the tests use to make small MNIST files)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def _find(data_dir: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        if (data_dir / name).is_file():
            return data_dir / name
    raise FileNotFoundError(f"{data_dir}: no {stem}[.gz]")


def load_mnist_dataset(data_dir, seed: int, smoke: bool, max_bytes: int = MAX_IDX_BYTES) -> Dataset:
    """MNIST from the four IDX files in ``data_dir``: ``pixel`` (N, 784) uint8, ``label`` (N,);
    a file declaring more than ``max_bytes`` of data is refused (``InputTooLarge``)."""
    if data_dir is None:
        raise FileNotFoundError("singa.data=mnist needs singa.data_dir=<folder with the IDX files>")
    data_dir = Path(data_dir)
    splits = {}
    for split, (images, labels) in MNIST_FILES.items():
        x = read_idx(_find(data_dir, images), max_bytes)
        y = read_idx(_find(data_dir, labels), max_bytes).astype(np.int64)
        if smoke:
            x, y = x[:2000], y[:2000]
        splits[split] = {"pixel": x.reshape(len(x), -1), "label": y}
    hw = tuple(read_idx(_find(data_dir, MNIST_FILES["test"][0]), max_bytes).shape[1:])
    return Dataset("mnist", splits["train"], splits["test"], {"num_classes": 10, "image_hw": hw})
