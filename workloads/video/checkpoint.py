"""The video run's own checkpoint: every stream's state at the end of an epoch, in the run storage.

Written by the driver after each epoch's states came back from the streams' rank 0 (train.py)
and were validated: ``<run storage>/video_checkpoint.pt`` (orchard/storage/, so a bucket on a
cluster), one ``torch.save`` of plain values only (bytes, ints, strings): ``torch.load(...,
weights_only=True)`` reads it back, no user object is ever unpickled. Written whole (renamed into
place, or one object), so a run killed mid-write keeps the previous epoch's checkpoint.

``python -m orchard resume <run id>`` points ``video.resume`` at the interrupted run's folder; the
new run reads this file from storage alone and trains only the epochs after ``epoch``.
"""
from __future__ import annotations

import io
import json

CHECKPOINT_NAME = "video_checkpoint.pt"


def save_checkpoint(storage, epoch: int, states: dict[str, bytes], steps: dict[str, int], alloc: dict[str, int],
                    history: list[dict], waits: dict[str, list[float]], training_done: bool = False) -> None:
    """Write the checkpoint of the epoch ``epoch`` (0-based, the last one every stream finished).

    ``states``: stream -> ``torch.save``d ``replica.state_dict()`` (model and optimizer);
    ``steps``: stream -> optimizer steps so far (per-step metrics continue from there);
    ``training_done``: the run stopped training for good (its target met or its last epoch).
    """
    import torch

    meta = {"epoch": int(epoch), "steps": {s: int(n) for s, n in steps.items()},
            "alloc": {s: int(n) for s, n in alloc.items()}, "history": history, "waits": waits,
            "training_done": bool(training_done)}
    buf = io.BytesIO()
    torch.save({"meta": json.dumps(meta), "states": {s: bytes(b) for s, b in states.items()}}, buf)
    storage.write_bytes(CHECKPOINT_NAME, buf.getvalue())


def load_checkpoint(storage) -> dict:
    """``{"epoch", "steps", "alloc", "history", "waits", "training_done", "states"}`` from
    ``storage`` (an ``orchard.storage.Storage`` holding ``CHECKPOINT_NAME``)."""
    import torch

    data = torch.load(io.BytesIO(storage.read_bytes(CHECKPOINT_NAME)), weights_only=True)
    return {**json.loads(data["meta"]), "states": dict(data["states"])}
