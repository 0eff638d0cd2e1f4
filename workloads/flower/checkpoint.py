"""What a flower train run saves and how a run resumes from it.

- Ray Train checkpoints (``checkpoint_*`` under ``<train storage>/flower/``), written and read
  by the workers through ``orchard.strategies.worker`` (``save_checkpoint``/``load_checkpoint``
  in train.py): every ``strategy.checkpoint_every`` epochs and after the last one. A resumed
  run (``flower.resume``, ``python -m orchard resume``) continues the previous run's Train run
  (same storage path and name), and every run folder names that storage in ``train_storage.txt``.
- the trained model, ``model.pt`` in the run storage: the weights only (``torch.load(
  weights_only=True)``), its density scale and tile size; the MLflow Model carries it too
  (predict.py).

Light on purpose (``__init__.validate`` reads it): torch is imported inside the functions.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import FlowerCounterCNN

MODEL_FILE = "model.pt"
TRAIN_STORAGE_NOTE = "train_storage.txt"  # in a run folder: where its Ray Train run keeps checkpoints


def train_storage(run):
    """Where a train run's Ray Train checkpoints live (an ``orchard.storage.Storage``), given the
    run's storage: its ``/train``, or, for a run that resumed another, the storage it continued
    (named in its ``train_storage.txt``).  Read from storage, so the driver's folder may be gone."""
    from orchard.api import Storage

    return Storage(run.read_text(TRAIN_STORAGE_NOTE).strip()) if run.exists(TRAIN_STORAGE_NOTE) else run.child("train")


def resolve(ctx):
    """The Train storage of this run, noted in its ``train_storage.txt`` (a resume of this run
    finds it there). A resumed run continues the previous run's Train run (same storage path
    and name): Ray Train restores its latest checkpoint, and new checkpoints join it there."""
    storage = (train_storage(ctx.previous_storage) if ctx.previous_storage is not None
               else ctx.storage.child("train"))
    ctx.storage.write_text(TRAIN_STORAGE_NOTE, storage.uri)  # a resume of this run finds it
    return storage


def save_weights(run_storage, module, density_scale: float, tile_size: int) -> None:
    """Rank 0 at the end of training: the trained weights as ``model.pt`` in the run storage."""
    import io

    import torch

    state = {k: v.contiguous() for k, v in module.state_dict().items()}  # channels_last or not: one file format
    buffer = io.BytesIO()
    torch.save({"model": state, "density_scale": density_scale, "tile_size": tile_size}, buffer)
    run_storage.write_bytes(MODEL_FILE, buffer.getvalue())


def load_model(path: str | Path, device: str = "cpu") -> tuple[FlowerCounterCNN, float]:
    """The trained model saved by `train_loop` (weights only) on ``device``, and its density scale."""
    import torch

    from .model import FlowerCounterCNN

    data = torch.load(Path(path), map_location="cpu", weights_only=True)
    model = FlowerCounterCNN()
    model.load_state_dict(data["model"])
    return model.to(device).eval(), float(data["density_scale"])
