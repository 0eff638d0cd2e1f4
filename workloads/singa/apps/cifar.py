"""CIFAR-10 (4.2): the python batches when given, else a CIFAR-shaped set made from real digits.

The python batches are pickles.  Unpickling a user file can run code, so ``_SafeUnpickler``
allows only what a CIFAR batch holds (dicts, lists, bytes, numpy arrays) and refuses any other
global.  No CIFAR ships in any package here (GROUND.md), so by default the cnn app trains on
``digits_rgb``: each real 8x8 scikit-learn digit upscaled to 24x24, placed at a random offset in
a 32x32 RGB canvas with a random light foreground colour on a random dark background and pixel
noise; 10 classes, the
same (N, 3, 32, 32) uint8 layout as CIFAR.  Train and test come from disjoint digit images.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from ..data import check_input_size, Dataset, MAX_INPUT_MB, stratified_split

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),  # how protocol-2 pickles from Python 3 store raw bytes: harmless
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name}: not part of a CIFAR batch")


def read_cifar_batch(path: str | Path, max_bytes: int = MAX_INPUT_MB * 2**20) -> tuple[np.ndarray, np.ndarray]:
    """One python batch -> images (N, 3, 32, 32) uint8, labels (N,) int64; a file over
    ``max_bytes`` is refused before it is read (``InputTooLarge``)."""
    check_input_size(path, Path(path).stat().st_size, max_bytes)
    with open(path, "rb") as f:
        batch = _SafeUnpickler(f, encoding="bytes").load()
    batch = {(k.decode() if isinstance(k, bytes) else k): v for k, v in batch.items()}
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch.get("labels", batch.get("fine_labels")), dtype=np.int64)
    return data.reshape(len(data), 3, 32, 32), labels


def load_cifar_dataset(data_dir, seed: int, smoke: bool, max_bytes: int = MAX_INPUT_MB * 2**20) -> Dataset:
    """``data_batch_*`` and ``test_batch`` from ``data_dir`` (cifar-10-batches-py)."""
    if data_dir is None:
        raise FileNotFoundError("singa.data=cifar10 needs singa.data_dir=<cifar-10-batches-py folder>")
    data_dir = Path(data_dir)
    files = sorted(data_dir.glob("data_batch_*"))
    if not files or not (data_dir / "test_batch").is_file():
        raise FileNotFoundError(f"{data_dir}: needs data_batch_1..5 and test_batch")
    parts = [read_cifar_batch(f, max_bytes) for f in files]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    tx, ty = read_cifar_batch(data_dir / "test_batch", max_bytes)
    if smoke:
        x, y, tx, ty = x[:1000], y[:1000], tx[:500], ty[:500]
    return Dataset("cifar10", {"image": x, "label": y}, {"image": tx, "label": ty},
                   {"num_classes": 10, "image_hw": (32, 32)})


def render_digits_rgb(digits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N, 8, 8) digits in 0..16 -> (N, 3, 32, 32) uint8 coloured, shifted, noisy images."""
    import torch
    import torch.nn.functional as F

    n = len(digits)
    up = F.interpolate(torch.as_tensor(digits, dtype=torch.float32)[:, None] / 16.0, size=(24, 24),
                       mode="bilinear", align_corners=False)[:, 0].numpy()
    canvas = np.zeros((n, 32, 32), np.float32)
    offsets = rng.integers(0, 9, size=(n, 2))
    for i, (dy, dx) in enumerate(offsets):
        canvas[i, dy:dy + 24, dx:dx + 24] = up[i]
    # Random colours, but the digit stays brighter than its background in every channel (a dark
    # scene with a light object), so shape, not a colour contrast lottery, decides the class.
    bg = rng.uniform(0.0, 0.45, size=(n, 3, 1, 1))
    fg = rng.uniform(0.55, 1.0, size=(n, 3, 1, 1))
    alpha = np.clip(canvas, 0, 1)[:, None]
    img = bg * (1 - alpha) + fg * alpha + rng.normal(0, 0.04, size=(n, 3, 32, 32))
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def load_digits_rgb_dataset(data_dir, seed: int, smoke: bool) -> Dataset:
    """CIFAR-shaped 10-class colour images from real digits: 6000 train / 1000 test renders
    (smoke: 600 / 200); test renders use only held-out digit images."""
    from .digits import sklearn_digits

    images, labels = sklearn_digits()
    train_idx, test_idx = stratified_split(labels, 0.2, seed)
    rng = np.random.default_rng(seed + 1)
    n_train, n_test = (600, 200) if smoke else (6000, 1000)
    pick_train = rng.choice(train_idx, n_train)
    pick_test = rng.choice(test_idx, n_test)
    return Dataset("digits_rgb",
                   {"image": render_digits_rgb(images[pick_train], rng), "label": labels[pick_train]},
                   {"image": render_digits_rgb(images[pick_test], rng), "label": labels[pick_test]},
                   {"num_classes": 10, "image_hw": (32, 32)})
