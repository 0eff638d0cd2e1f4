"""The msae app's MLflow Model (4.3, Fig. 11): its retrieval as the prediction.

Images in (samples of the net's ``image`` field), and for each the ``k`` tag documents of the
model's database nearest to it in the shared latent space out.  The database is the test set's
documents coded by the trained text encoder (``database.npz``: codes and labels; their words in
``net.json``), so the model answers without the training data.  Loaded by
``workloads.singa.predict._load_pyfunc`` like the classifiers (no pickle, no Ray).

``mode=predict`` over files (``predict.predict`` hands an msae model to ``QueryPredictor``): each
file holds query images as the app's data has them, image feature vectors (N, *image shape), in
numpy's own formats, read with ``allow_pickle=False``: a ``.npy`` of the images, or a ``.npz``
with ``image`` (N, ...) and optionally ``label`` (N,) class ids (then precision@k is reported).
Each file's retrieval, the pyfunc's table, goes to ``predictions/retrieved/<file>.csv``.
"""
from __future__ import annotations

import tempfile
import zipfile
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
        from .layers.base import import_layer_modules
        from .model import NeuralNet

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
    from orchard.api import save_model, save_pyfunc

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


# --------------------------------------------------------------------------- mode=predict over files
QUERY_SUFFIXES = (".npy", ".npz")
RETRIEVED_DIR = "retrieved"   # in the predictions folder: <file>.csv, the pyfunc's table of that file's images
COLUMNS = ["path", "queries", "labelled", "relevant", "nearest"]   # predictions.csv, one row per file


class NotQueries(ValueError):
    """A file that holds no images this model takes: another format, array, shape or type."""

    kind = "not_queries"   # data/skipped_files/not_queries (orchard/tracking/skipped.py)


def allowed(shape: tuple) -> str:
    """What a query file may be, for the line that refuses one."""
    dims = ", ".join(map(str, ("N", *shape)))
    return f"allowed: .npy of images ({dims}), or .npz with `{QUERY_FIELD}` ({dims}) and optionally `label` (N,)"


def read_queries(path: Path, shape: tuple, max_bytes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """A query file -> (images (N, *shape) float32, class ids (N,) or None).  ``NotQueries`` for a
    file of another kind, ``InputTooLarge`` for one over ``max_bytes`` (an .npz: unpacked),
    ValueError for one numpy cannot read.  Never unpickles (``allow_pickle=False``)."""
    from .data import InputTooLarge, check_input_size

    suffix = path.suffix.lower()
    if suffix not in QUERY_SUFFIXES:
        raise NotQueries(f"not a query file; {allowed(shape)}")
    magic = {".npy": b"\x93NUMPY", ".npz": b"PK"}[suffix]   # without it, np.load would try the file as a pickle
    with open(path, "rb") as fh:
        if fh.read(len(magic)) != magic:
            raise ValueError(f"not a {suffix} file as numpy writes one; {allowed(shape)}")
    size = path.stat().st_size
    if suffix == ".npz":   # compressed members: what they unpack to
        try:
            with zipfile.ZipFile(path) as packed:
                size = max(size, sum(info.file_size for info in packed.infolist()))
        except zipfile.BadZipFile as exc:
            raise ValueError(f"not a readable .npz file ({str(exc)[:80]}); {allowed(shape)}") from None
    try:
        check_input_size(path, size, max_bytes)
    except InputTooLarge as exc:
        raise InputTooLarge(str(exc).replace(f"{path} ", "", 1)) from None
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                if QUERY_FIELD not in loaded.files:
                    held = ", ".join(loaded.files) or "nothing"
                    raise NotQueries(f"an .npz without `{QUERY_FIELD}` (it holds {held}); {allowed(shape)}")
                x, y = loaded[QUERY_FIELD], (loaded["label"] if "label" in loaded.files else None)
        else:
            x, y = loaded, None
    except NotQueries:
        raise
    except Exception as exc:  # a truncated or foreign file, or Python objects (a pickle inside)
        if "allow_pickle" in str(exc):
            raise NotQueries(f"holds Python objects, which are never unpickled; {allowed(shape)}") from None
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:80]
        raise ValueError(f"not a readable {suffix} file ({reason}); {allowed(shape)}") from None
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise NotQueries(f"holds {x.dtype} values, not numbers; {allowed(shape)}")
    if x.shape == shape:   # one image
        x = x[None]
    if x.shape[1:] != shape or not len(x):
        raise NotQueries(f"holds an array of shape {x.shape}; {allowed(shape)}")
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise NotQueries("holds NaN or infinite values; images are finite numbers")
    if y is not None and (y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer)):
        raise NotQueries(f"`label` is {y.dtype} {y.shape}; it must be class ids (N,), one per image ({len(x)})")
    return x, y


class QueryPredictor:
    """Ray Data actor (orchard.models.batch_predict.predict_files): holds the retrieval model, answers
    each query file with its table in ``retrieved/<file>.csv`` and a row of counts."""

    def __init__(self, model_dir: str, out_dir: str, net: str, load, max_input_mb: float | None = None):
        """``load``: predict.py's model loader, handed in (this module is below predict.py)."""
        import torch

        from .data import MAX_INPUT_MB

        torch.set_num_threads(1)
        self.model = load(str((Path(model_dir) / net).parent))  # the net.json predict checked
        self.out = Path(out_dir) / RETRIEVED_DIR
        self.max_bytes = round(float(max_input_mb or MAX_INPUT_MB) * 2**20)
        # documents of one class each (digits_tags) make a labelled image's retrieval right or wrong;
        # NUS-WIDE's carry several concepts (the table's label is -1 there): no precision
        self.by_class = self.model.labels.ndim == 1

    def __call__(self, batch: dict) -> dict:
        from orchard.api import kind_of, one_line

        cols = {k: [] for k in ("path", "error", "kind", "queries", "labelled", "relevant", "nearest")}
        for path in batch["path"]:
            path = Path(str(path))
            try:
                x, y = read_queries(path, self.model.shapes[QUERY_FIELD], self.max_bytes)
                table = self.model.predict(x)
                table.to_csv(self.out / f"{path.name}.csv", index=False)
                labelled = y is not None and self.by_class
                relevant = int((table["label"].to_numpy() == y[table["query"].to_numpy()]).sum()) if labelled else 0
                values = ("", "", len(x), len(x) if labelled else 0, relevant, int(table["rank"].max()) + 1)
            except Exception as exc:  # one bad file never stops the run: skipped and counted by kind
                values = (one_line(exc), kind_of(exc), 0, 0, 0, 0)
            cols["path"].append(str(path))
            for key, value in zip(list(cols)[1:], values):
                cols[key].append(value)
        return {k: np.asarray(v) for k, v in cols.items()}


def totals(good: list[dict], elapsed_s: float) -> dict[str, float]:
    """The metrics of the files answered: ``predict/queries`` (images), ``predict/queries_per_s``
    and, over the images with a class id, ``predict/precision_at_<k>`` (the run's
    ``test/precision_at_10_img2txt`` on new images) and ``predict/labelled_queries``."""
    queries = sum(int(r["queries"]) for r in good)
    metrics = {"predict/queries": float(queries), "predict/queries_per_s": queries / max(elapsed_s, 1e-9)}
    labelled = sum(int(r["labelled"]) for r in good)
    if labelled:
        k = max(int(r["nearest"]) for r in good)
        metrics[f"predict/precision_at_{k}"] = sum(int(r["relevant"]) for r in good) / (labelled * k)
        metrics["predict/labelled_queries"] = float(labelled)
    return metrics
