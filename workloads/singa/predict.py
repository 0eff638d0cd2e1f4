"""mode=predict for singa, and the MLflow Model a train run logs.

The model is a ``pyfunc`` with this module as its ``loader_module``: the net config (the YAML
layer list, the per-sample input shapes, the user's ``layer_modules``) in ``net.json`` and the
parameters in ``params.npz`` (no pickle).  Its input is samples of the net's data field, e.g.
``pixel`` (N, 64) uint8 for the digits MLP, ``image`` (N, 3, 32, 32) uint8 for the CIFAR CNN;
its output is the class probabilities (N, K) of the net's ``softmax_loss`` layer.  Classification
nets (one data field besides ``label``, a ``softmax_loss`` layer) are logged so; the msae app's
net as its retrieval (retrieval_model.py: images in, the nearest tag documents out); no other.

Prediction over files with a classifier (each file a row of predictions.csv, per-sample labels in
``predictions/labels/<file>.csv``; the msae's files of query images: retrieval_model.py):
- MNIST IDX images (``*-images-idx3-ubyte[.gz]``), labels from the ``*-labels-idx1-ubyte`` beside;
- CIFAR-10 python batches (``data_batch_*``, ``test_batch``), with their labels;
- images (.png, .jpg, ...), resized to the net's input, labelled by a numeric class folder
  (``input/3/x.png`` is a 3).
Accuracy is reported over every sample whose label is known.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

NET_FILE, PARAMS_FILE = "net.json", "params.npz"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


class SingaModel:
    """The pyfunc model: ``predict(samples)`` -> class probabilities (N, K); no Ray."""

    def __init__(self, config: dict, params: dict):
        from .layers.base import import_layer_modules
        from .model import NeuralNet

        import_layer_modules(config.get("layer_modules") or [])
        self.config = config
        self.field = config["field"]
        self.sample_shape = tuple(config["input_shapes"][self.field])
        self.net = NeuralNet(config["layers"], config["input_shapes"], seed=0)
        self.net.set_params(params, strict=False)
        self.loss = next(layer.name for layer in self.net.layers if layer.type == "softmax_loss")

    def predict(self, model_input, params=None, batch: int = 500) -> np.ndarray:
        import torch

        x = np.asarray(model_input)
        if x.shape[1:] != self.sample_shape:
            raise ValueError(f"samples of shape {self.sample_shape} (field {self.field}), got {x.shape[1:]}")
        out = []
        for i in range(0, len(x), batch):
            # a copy: the input may be read-only (an array from Ray's object store, an mmap), which
            # torch wraps only with a warning that writing to it is undefined
            chunk = torch.tensor(x[i:i + batch])
            records = {self.field: chunk, "label": torch.zeros(len(chunk), dtype=torch.int64)}
            out.append(self.net.features(records, [self.loss])[self.loss].numpy().copy())
        return np.concatenate(out) if out else np.zeros((0, self.config["num_classes"]), np.float32)


def _load_pyfunc(data_path: str):
    """MLflow's entry point (loader_module): rebuild the net from its plain files (a
    ``SingaModel``, or the msae's ``retrieval_model.RetrievalModel``)."""
    folder = Path(data_path)
    config = json.loads((folder / NET_FILE).read_text())
    with np.load(folder / PARAMS_FILE, allow_pickle=False) as data:
        params = {k: np.array(data[k]) for k in data.files}
    if config.get("kind") == "retrieval":
        from . import retrieval_model

        return retrieval_model.load(folder, config, params)
    return SingaModel(config, params)


def log_model(ctx, spec: dict, params: dict) -> Path | None:
    """At the end of training: the net (config + parameters) as an MLflow pyfunc Model
    (artifact ``model``); None for a net that does not classify (nothing to predict)."""
    import tempfile

    from orchard.api import save_model, save_pyfunc
    from .data import load_dataset
    from .retrieval_model import is_retrieval_net, save_retrieval_model

    data = load_dataset(spec["data"], spec.get("data_dir"), spec["seed"], True,
                        spec.get("max_input_mb"))  # shapes and an example
    shapes = data.shapes()
    fields = [k for k in shapes if k != "label"]
    config = {"layers": spec["layers"], "input_shapes": {k: list(v) for k, v in shapes.items()},
              "field": fields[0], "num_classes": int(data.meta.get("num_classes", 10)),
              "image_hw": list(data.meta.get("image_hw") or ()), "layer_modules": spec.get("layer_modules") or [],
              "data": spec["data"]}

    def write_net(folder: Path) -> None:
        (folder / NET_FILE).write_text(json.dumps(config))
        np.savez(folder / PARAMS_FILE, **{k: np.asarray(v, np.float32) for k, v in params.items()})

    if is_retrieval_net(fields, spec["layers"]):  # the msae app: its retrieval is the prediction
        return save_retrieval_model(ctx, config, params, data, write_net)
    if len(fields) != 1 or "label" not in shapes or not any(l.get("type") == "softmax_loss" for l in spec["layers"]):
        print("singa: the net is neither a single-input classifier nor the msae; no MLflow Model logged", flush=True)
        return None
    model = SingaModel(config, params)

    def write(path: Path, metadata: dict) -> None:
        with tempfile.TemporaryDirectory(prefix="orchard-singa-") as tmp:
            folder = Path(tmp) / "net"
            folder.mkdir()
            write_net(folder)
            example = np.ascontiguousarray(data.test[fields[0]][:2])
            save_pyfunc(path, {**metadata, "field": fields[0], "data": spec["data"]}, "workloads.singa.predict",
                        folder, example, model.predict(example))

    return save_model(ctx, "singa", write)


# --------------------------------------------------------------------------- files
def to_samples(images: list[np.ndarray], config: dict) -> np.ndarray:
    """Decoded images (H, W) or (H, W, 3) uint8 -> the net's samples (N, *sample_shape) uint8."""
    import cv2

    shape = tuple(config["input_shapes"][config["field"]])
    out = []
    for img in images:
        if len(shape) == 3:            # (3, H, W) colour
            c, h, w = shape
            rgb = img if img.ndim == 3 else np.repeat(img[..., None], 3, axis=2)
            out.append(cv2.resize(rgb[..., :3], (w, h), interpolation=cv2.INTER_AREA).transpose(2, 0, 1))
        else:                          # (H*W,) grey
            h, w = config.get("image_hw") or (int(round(np.sqrt(shape[0]))),) * 2
            grey = img if img.ndim == 2 else cv2.cvtColor(img[..., :3], cv2.COLOR_RGB2GRAY)
            out.append(cv2.resize(grey, (w, h), interpolation=cv2.INTER_AREA).reshape(-1))
    return np.stack(out).astype(np.uint8)


def idx_labels_path(path: Path) -> Path:
    """The IDX label file that goes with an IDX image file (MNIST's naming)."""
    return path.with_name(path.name.replace("images-idx3", "labels-idx1").replace("images.idx3", "labels.idx1"))


def idx_labels(path: Path) -> list[Path]:
    """The files read beside ``path``: its IDX label file, if there is one."""
    labels = idx_labels_path(path)
    return [labels] if "idx3" in path.name.lower() and labels != path and labels.is_file() else []


def read_samples(path: Path, config: dict, max_bytes: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A file -> (samples, labels or None); ValueError (the reason) for a file that is none of
    an IDX image file, a CIFAR-10 batch, an image, or holds (an IDX file: declares) more than
    ``max_bytes`` (singa.max_input_mb; None: its default)."""
    import cv2

    from .data import MAX_INPUT_MB, InputTooLarge, check_input_size

    max_bytes = int(max_bytes or MAX_INPUT_MB * 2**20)
    name = path.name.lower()
    shape = tuple(config["input_shapes"][config["field"]])
    if "idx3" in name:
        from .apps.digits import read_idx

        try:
            x = read_idx(path, max_bytes)
        except InputTooLarge as exc:
            raise InputTooLarge(str(exc).replace(f"{path} ", "", 1)) from None
        except Exception as exc:  # truncated header (struct.error), wrong magic, short data
            raise ValueError(f"not an IDX image file: {str(exc).splitlines()[0][:120]}") from None
        labels_path = idx_labels_path(path)
        y = read_idx(labels_path, max_bytes).astype(np.int64) if labels_path.is_file() else None
        samples = to_samples(list(x), config) if x.shape[1:] != shape and x.reshape(len(x), -1).shape[1:] != shape \
            else x.reshape(len(x), *shape)
        return samples, (y if y is not None and len(y) == len(samples) else None)
    if name.startswith(("data_batch", "test_batch")):
        from .apps.cifar import read_cifar_batch

        try:
            x, y = read_cifar_batch(path, max_bytes)
        except InputTooLarge as exc:
            raise InputTooLarge(str(exc).replace(f"{path} ", "", 1)) from None
        except Exception as exc:  # a corrupt or foreign pickle: refused by the safe unpickler
            raise ValueError(f"not a CIFAR-10 batch: {str(exc).splitlines()[0][:120]}") from None
        samples = x if x.shape[1:] == shape else to_samples(list(x.transpose(0, 2, 3, 1)), config)
        return samples, y
    try:
        check_input_size(path, path.stat().st_size, max_bytes)
    except InputTooLarge as exc:
        raise InputTooLarge(str(exc).replace(f"{path} ", "", 1)) from None
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise ValueError("not a readable image (corrupt or not an image)")
    if img.dtype != np.uint8:
        img = cv2.convertScaleAbs(img, alpha=255.0 / max(float(img.max()), 1.0))
    if img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGB if img.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    label = int(path.parent.name) if path.parent.name.isdigit() else None
    return to_samples([img], config), (np.array([label]) if label is not None else None)


class Predictor:
    """Ray Data actor: holds the net, classifies a batch of files."""

    def __init__(self, model_dir: str, out_dir: str, net: str, max_input_mb: float | None = None):
        import torch

        torch.set_num_threads(1)
        self.model = _load_pyfunc(str((Path(model_dir) / net).parent))  # the net.json predict checked
        self.out = Path(out_dir)
        self.max_bytes = round(float(max_input_mb) * 2**20) if max_input_mb else None

    def __call__(self, batch: dict) -> dict:
        from orchard.api import kind_of

        cols = {k: [] for k in ("path", "error", "kind", "samples", "labelled", "correct", "label", "confidence")}
        for path in batch["path"]:
            path = Path(str(path))
            try:
                x, y = read_samples(path, self.model.config, self.max_bytes)
                probs = self.model.predict(x)
                pred = probs.argmax(1)
                if len(x) > 1:  # a container file: its samples' labels in a CSV of their own
                    with open(self.out / "labels" / f"{path.name}.csv", "w", newline="") as fh:
                        w = csv.writer(fh)
                        w.writerow(("index", "label", "confidence", "truth"))
                        for i in range(len(x)):
                            w.writerow((i, int(pred[i]), round(float(probs[i, pred[i]]), 4),
                                        "" if y is None else int(y[i])))
                values = ("", "", len(x), 0 if y is None else len(y), 0 if y is None else int((pred == y).sum()),
                          int(pred[0]) if len(x) == 1 else -1, float(probs[0, pred[0]]) if len(x) == 1 else 0.0)
            except Exception as exc:  # one bad file never stops the run: skipped and counted by kind
                values = (str(exc).splitlines()[0][:200] or type(exc).__name__, kind_of(exc), 0, 0, 0, -1, 0.0)
            cols["path"].append(str(path))
            for key, value in zip(("error", "kind", "samples", "labelled", "correct", "label", "confidence"), values):
                cols[key].append(value)
        return {k: np.asarray(v) for k, v in cols.items()}


def sample_files(source) -> list[Path]:
    """Files of ``input`` (and of its numeric class folders); IDX label files and CIFAR's
    ``batches.meta`` are read beside what they label, not on their own."""
    from orchard.api import listed_inputs

    source = Path(source).expanduser()
    files = listed_inputs(source, ())   # links to nothing and unreadable files too: skipped and counted
    if source.is_dir():
        for sub in sorted(p for p in source.iterdir() if p.is_dir() and p.name.isdigit()):
            files += listed_inputs(sub, IMAGE_SUFFIXES)
    return [p for p in files if "labels-idx1" not in p.name and "labels.idx1" not in p.name
            and p.name not in ("batches.meta", "readme.html")]


def predict(cfg: dict, ctx, out: Path) -> dict[str, float]:
    """``mode=predict``: classify every sample of ``input`` into ``out`` (the predictions folder the
    core opened: orchard/config/registry.py ``entry``), accuracy over the samples with known labels; for
    the msae's model, retrieve each query image's nearest tag documents (retrieval_model.py)."""
    from orchard.api import batch_predict, skipped

    s = cfg["singa"]
    trusted = ("layer_modules", s.get("layer_modules"), "singa.layer_modules")

    def plan(meta: dict, source: Path) -> batch_predict.Plan:
        args = {"max_input_mb": s.get("max_input_mb")}
        if meta.get("kind") == "retrieval":   # the msae: files of query images in, their nearest tag documents out
            from . import retrieval_model as retrieval

            # every file, so one of another kind is named, not passed over
            return batch_predict.Plan(NET_FILE, retrieval.QueryPredictor, skipped.listed_inputs(source, ()),
                                      retrieval.COLUMNS, "files", args={**args, "load": _load_pyfunc},
                                      settings_arg="net", trusted=trusted, subdir=retrieval.RETRIEVED_DIR,
                                      desc="retrieving", batch_size=16)
        return batch_predict.Plan(NET_FILE, Predictor, sample_files(source),
                                  ["path", "samples", "label", "confidence", "labelled", "correct"], "files", args=args,
                                  settings_arg="net", trusted=trusted, subdir="labels", companions=idx_labels,
                                  desc="classifying", batch_size=16)

    done = batch_predict.predict_inputs(cfg, ctx, out, "singa", plan)
    if done.meta.get("kind") == "retrieval":
        from .retrieval_model import totals
    else:
        totals = _classified
    return {**done.metrics, **totals(done.good, done.elapsed_s)}


def _classified(good: list[dict], elapsed_s: float) -> dict[str, float]:
    """The metrics of the files classified: ``predict/samples`` and their rate, and
    ``predict/accuracy`` over the samples with known labels."""
    samples = sum(int(r["samples"]) for r in good)
    labelled = sum(int(r["labelled"]) for r in good)
    metrics = {"predict/samples": float(samples), "predict/samples_per_s": samples / max(elapsed_s, 1e-9)}
    if labelled:
        metrics["predict/accuracy"] = sum(int(r["correct"]) for r in good) / labelled
        metrics["predict/labelled_samples"] = float(labelled)
    return metrics
