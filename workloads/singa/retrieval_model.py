"""The msae app's MLflow Model (4.3, Fig. 11): its retrieval as the prediction.

Images in (samples of the net's ``image`` field), and for each the ``k`` tag documents of the
model's database nearest to it in the shared latent space out.  The database is the test set's
documents coded by the trained text encoder (``database.npz``: codes and labels; their words in
``net.json``), so the model answers without the training data.  Loaded by
``workloads.singa.predict._load_pyfunc`` like the classifiers (no pickle, no Ray).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

DATABASE_FILE = "database.npz"
# the msae app's latent layers (conf/singa/apps/msae.yaml): images are the queries, documents the database
QUERY_LAYER, DOCUMENT_LAYER = "iz", "tz"
QUERY_FIELD, DOCUMENT_FIELD = "image", "text"
NEAREST = 10  # documents per image: the run's test/precision_at_10_img2txt is over these


def is_retrieval_net(fields: list[str], layers: list[dict]) -> bool:
    """The msae's shape: image and text fields, both latent layers."""
    names = {layer.get("name") for layer in layers}
    return sorted(fields) == sorted((QUERY_FIELD, DOCUMENT_FIELD)) and {QUERY_LAYER, DOCUMENT_LAYER} <= names


class RetrievalModel:
    """The pyfunc model: ``predict(images)`` -> a table of N x k rows, nearest first: ``query``
    (row of the input), ``rank`` (0: nearest), ``document`` (row of the database), ``distance``
    (Euclidean, in latent units), ``label`` (the document's class; -1 where documents carry several
    concepts, as NUS-WIDE's do) and ``tags`` (its words, where the dataset has them).  Images are
    float32 as the loader gives them: (N, 64) in 0..1 for digits_tags."""

    def __init__(self, config: dict, params: dict, database: dict):
        from workloads.singa.layers.base import import_layer_modules
        from workloads.singa.model import NeuralNet

        import_layer_modules(config.get("layer_modules") or [])
        self.config = config
        self.shapes = {k: tuple(v) for k, v in config["input_shapes"].items()}
        self.net = NeuralNet(config["layers"], config["input_shapes"], seed=0)
        self.net.set_params(params, strict=False)
        self.codes, self.labels = database.get("codes"), database.get("labels")

    def encode(self, samples, field: str, layer: str, batch: int = 500) -> np.ndarray:
        """Latent codes (N, D) at ``layer`` of ``samples`` of ``field`` (the net's other fields zero)."""
        import torch

        x = np.asarray(samples)
        if x.shape[1:] != self.shapes[field]:
            raise ValueError(f"samples of shape {self.shapes[field]} (field {field}), got {x.shape[1:]}")
        x = x.astype(np.float32)
        out = []
        for i in range(0, len(x), batch):
            chunk = torch.as_tensor(x[i:i + batch])
            records = {k: torch.zeros((len(chunk), *shape), dtype=torch.int64 if k == "label" else torch.float32)
                       for k, shape in self.shapes.items()}
            records[field] = chunk
            out.append(self.net.features(records, [layer])[layer].reshape(len(chunk), -1).numpy().copy())
        return np.concatenate(out) if out else np.zeros((0, int(self.net.by_name[layer].data.feature.shape[-1])))

    def predict(self, model_input, params=None):
        import pandas as pd

        k = min(int(self.config["k"]), len(self.codes))
        query = self.encode(model_input, QUERY_FIELD, QUERY_LAYER)
        squared = ((query[:, None, :] - self.codes[None, :, :]) ** 2).sum(-1)
        nearest = np.argsort(squared, axis=1)[:, :k]
        rows = nearest.reshape(-1)
        labels = self.labels if self.labels.ndim == 1 else np.full(len(self.codes), -1)
        documents = self.config.get("documents") or [""] * len(self.codes)
        return pd.DataFrame({"query": np.repeat(np.arange(len(query)), k), "rank": np.tile(np.arange(k), len(query)),
                             "document": rows, "distance": np.sqrt(np.take_along_axis(squared, nearest, 1)).reshape(-1),
                             "label": labels[rows].astype(np.int64), "tags": [documents[j] for j in rows]})


def load(folder: Path, config: dict, params: dict) -> RetrievalModel:
    with np.load(folder / DATABASE_FILE, allow_pickle=False) as data:
        return RetrievalModel(config, params, {k: np.array(data[k]) for k in data.files})


def save_retrieval_model(ctx, config: dict, params: dict, data, write_net) -> Path:
    """Log the msae net as a retrieval model (``orchard.models.save_model``); ``config`` is the
    net's (predict.log_model), ``data`` its dataset, ``write_net(folder)`` writes net.json and
    params.npz.  Returns the local model folder."""
    from orchard.models import save_model, save_pyfunc

    config.update(kind="retrieval", k=NEAREST, documents=[" ".join(d) for d in data.meta.get("test_docs", [])])
    model = RetrievalModel(config, params, {})
    model.codes = model.encode(data.test[DOCUMENT_FIELD], DOCUMENT_FIELD, DOCUMENT_LAYER)
    model.labels = np.asarray(data.test["label"])

    def write(path: Path, metadata: dict) -> None:
        with tempfile.TemporaryDirectory(prefix="orchard-singa-") as tmp:
            folder = Path(tmp) / "net"
            folder.mkdir()
            write_net(folder)
            np.savez(folder / DATABASE_FILE, codes=model.codes, labels=model.labels)
            example = np.ascontiguousarray(data.test[QUERY_FIELD][:2])
            save_pyfunc(path, {**metadata, "field": QUERY_FIELD, "data": config["data"], "kind": "retrieval"},
                        "workloads.singa.predict", folder, example, model.predict(example), free_outputs=())

    return save_model(ctx, "singa", write)
