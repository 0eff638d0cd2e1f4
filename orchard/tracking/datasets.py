"""A training run's data as an MLflow Dataset input, so the MLflow UI's runs table (its Dataset
column) tells runs on different data apart and runs on the same data together.

Each workload says what it trains on with ``dataset(cfg) -> dict`` in its contract: either
``{"name", "path"}`` (the user's folder or file) or ``{"name", "generator", "settings"}`` (the
synthetic data it generates).  The digest is of the data's content (a folder's files) or of the
generator's settings (same settings, same seed: the same data), so every trial of a sweep that
does not sweep the data shares one dataset.  Logged once, when the run opens
(``orchard.tracking.mlflow_run.open_run``), with the context ``training``.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from pathlib import Path

CONTEXT = "training"
DIGEST_CHARS = 12
# Folders up to this size are hashed byte for byte (digits, MNIST, CIFAR-10: well under a second);
# past it names, sizes and modification times stand for the content (a video folder of many GB
# would cost minutes at every start).
CONTENT_HASH_LIMIT_BYTES = 256 * 2**20


def training_data(cfg: dict):
    """The run's data as an ``mlflow.data`` MetaDataset (a source, a name, a digest), or None
    when the workload declares no ``dataset(cfg)``."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    from orchard.config import registry

    declared = getattr(registry.load(cfg["workload"]["name"]), "dataset", None)
    if declared is None:
        return None
    spec = declared(cfg)
    if spec.get("path"):
        path = str(spec["path"])
        # a local folder not made yet (a sweep's parent opens before the data is generated): named, not read
        local = "://" not in path and Path(os.path.expanduser(path)).exists()
        with warnings.catch_warnings():
            # MLflow registers its local source twice (bare paths and file:// URIs), so every local
            # path "can be interpreted in multiple ways" by two classes of one name: not the user's
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            source = resolve_dataset_source(str(Path(os.path.expanduser(path)).resolve()) if local else path)
        digest = content_digest(Path(os.path.expanduser(path))) if local else _digest(path)
    else:   # generated: what the generator was given is what the data is
        settings = {"generator": spec["generator"], **spec.get("settings", {})}
        source = CodeDatasetSource(tags=settings)
        digest = _digest(json.dumps(settings, sort_keys=True, default=str))
    return MetaDataset(source, name=spec["name"], digest=digest)


def log_training_data(client, run_id: str, cfg: dict) -> None:
    """Record the run's data as its dataset input (context ``training``).  A workload whose
    data cannot be described is told in one line; the run goes on without the input."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    from orchard.terminal.console import say
    from orchard.tracking.store import retried

    try:
        found = training_data(cfg)
    except Exception as exc:  # a folder that vanished since the config check: the workload will say so
        say(f"orchard: the run's data is not recorded as a dataset: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        return
    if found is None:
        return
    d = found.to_dict()
    entity = Dataset(name=d["name"], digest=d["digest"], source_type=d["source_type"], source=d["source"],
                     schema=d.get("schema"), profile=d.get("profile"))
    retried(client.log_inputs, run_id, datasets=[DatasetInput(entity, [InputTag(MLFLOW_DATASET_CONTEXT, CONTEXT)])])


def content_digest(path: Path) -> str:
    """A digest of a file's or a folder's content (its files' relative names and bytes, or past
    ``CONTENT_HASH_LIMIT_BYTES`` their names, sizes and modification times)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stats = [(p, p.stat()) for p in files]
    whole = sum(st.st_size for _, st in stats) <= CONTENT_HASH_LIMIT_BYTES
    h = hashlib.sha256()
    for p, st in stats:
        h.update(str(p.relative_to(path) if p != path else p.name).encode() + b"\0")
        if whole:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:DIGEST_CHARS]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]
