"""What a singa run saves and how it goes on from it: the net's parameters as of the last
checkpointed epoch (``CHECKPOINT_NAME`` in the run storage, orchard/storage/), with the stage
(pre-training RBM i, then BP) and epoch they belong to.  ``python -m orchard resume <run id>``
(``singa.resume``) starts from it; a rebuilt architecture after a lost node (train.fit) too."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from orchard.api import check_weights

CHECKPOINT_NAME = "singa_checkpoint.npz"  # in the run folder: the parameters as of the last checkpointed epoch


class Checkpointer:
    """Writes the net's parameters every ``every`` epochs (``strategy.checkpoint_every``) with the
    stage (pre-training RBM i, then BP = len(pretrain)) and epoch they belong to.  npz, no pickle;
    written whole to the run storage (a local file is renamed into place, an object is published
    whole), so a kill mid-write keeps the previous checkpoint."""

    def __init__(self, storage, every: int):
        self.storage, self.every = storage, max(1, every)
        self.stage, self.base = 0, None

    def for_stage(self, stage: int, base: dict | None) -> Checkpointer:
        self.stage, self.base = stage, base
        return self

    def __call__(self, epoch: int, epochs: int, params_fn) -> None:
        if epoch % self.every and epoch != epochs:
            return
        params = {**(self.base or {}), **params_fn()}
        buffer = io.BytesIO()
        np.savez(buffer, _meta=np.array(json.dumps({"stage": self.stage, "epoch": epoch})),
                 **{f"p:{k}": np.asarray(v) for k, v in params.items()})
        self.storage.write_bytes(CHECKPOINT_NAME, buffer.getvalue())


def load_checkpoint(source) -> dict:
    """``{"stage", "epoch", "params"}`` of a checkpoint written by ``Checkpointer``: a file path,
    or the run storage (``orchard.storage.Storage``) holding ``CHECKPOINT_NAME``."""
    if hasattr(source, "read_bytes") and not isinstance(source, Path):
        source = io.BytesIO(source.read_bytes(CHECKPOINT_NAME))
    with np.load(source, allow_pickle=False) as data:
        meta = json.loads(str(data["_meta"]))
        params = {k[2:]: np.array(data[k]) for k in data.files if k.startswith("p:")}
    return {**meta, "params": params}


def finite(params: dict, epoch: int, step: int, lr: dict | None) -> dict:
    """``params`` if every array is finite, else ``Diverged``: a checkpoint never holds NaN."""
    check_weights(params.values(), epoch=epoch, step=step, **(lr or {}))
    return params


def previous(previous_storage) -> dict | None:
    """The checkpoint of the run ``singa.resume`` names (``load_checkpoint``), or None: read from
    that run's storage (``ctx.previous_storage``: a bucket on a cluster, so a resume needs nothing
    from the driver's disk)."""
    return load_checkpoint(previous_storage) if previous_storage is not None else None


def stage_start(resumed: dict | None, stage: int) -> int:
    """The epoch a stage starts from: the checkpoint's for the stage it was in, else 0."""
    return int(resumed["epoch"]) if resumed is not None and resumed["stage"] == stage else 0


def restore_point(saver, start_epoch: int, initial: dict | None) -> tuple[int, dict | None]:
    """Where a rebuilt architecture goes on: this stage's last checkpoint (epoch, parameters),
    else the stage's own start."""
    if saver is not None and saver.storage.exists(CHECKPOINT_NAME):
        ckpt = load_checkpoint(saver.storage)
        if ckpt["stage"] == saver.stage:
            return int(ckpt["epoch"]), ckpt["params"]
    return start_epoch, initial
