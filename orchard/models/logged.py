"""How a trained model becomes the run's MLflow Model: written by the workload's own flavour into
``<run folder>/model``, then logged through MLflow's ``Model.log`` as the run's output (an MLflow 3
LoggedModel named ``model``), with what it needs to travel: the workload's package in its
``code/`` and its requirements pinned (docs/models.md, "Models that travel").  A predict run
records the model it applied as its input (``record_model_input``).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterable

MODEL_DIR = "model"                 # in a run folder, and the LoggedModel's name (runs:/<id>/model)


def pip_requirements(imports: Iterable[str] = ("torch",)) -> list[str]:
    """Pinned requirements of a logged model: MLflow and numpy, and the distributions that provide
    ``imports`` (the top-level modules its loader imports, e.g. ``numba``, ``cv2``) at the versions
    installed here.  Given explicitly, so MLflow does not spend seconds inferring them, and so the
    model's environment can be rebuilt from them alone: orchard itself is never one (the code
    travels in the model's ``code/``), and a local build label (torch's ``+cpu``) is dropped."""
    import importlib.metadata as md

    import mlflow
    import numpy

    pins = [f"mlflow=={mlflow.__version__}", f"numpy=={numpy.__version__}"]
    for module in imports:
        for dist in _providers(module):
            pin = f"{dist}=={md.version(dist).split('+')[0]}"
            if pin not in pins:
                pins.append(pin)
    return pins


def _providers(module: str) -> list[str]:
    """The distributions that install the top-level ``module``: the one of its own name where
    there is one (torch, numba), else those whose ``top_level.txt`` names it (cv2:
    opencv-python-headless), else what the installed distributions' file lists say. Those lists
    (``packages_distributions``: every distribution's RECORD, torch's thousands of lines among
    them) took 0.38 s of every forest and video model's logging; the 178 ``top_level.txt`` of this
    machine's venv, 9 ms (note, commit 10283c2, 2026-12-06, load 2, a CI running beside it)."""
    import importlib.metadata as md

    try:
        md.distribution(module)
        return [module]
    except md.PackageNotFoundError:
        pass
    named = [d.metadata["Name"] for d in md.distributions() if module in (d.read_text("top_level.txt") or "").split()]
    return named or md.packages_distributions().get(module, [module])


def save_model(ctx, workload: str, write: Callable[[Path, dict], None], extra_metadata: dict | None = None) -> Path:
    """Write the run's MLflow Model to ``<run folder>/model`` with ``write(path, metadata)``
    (which calls ``mlflow.<flavour>.save_model(path, ..., metadata=metadata)``, or
    ``save_pyfunc``, into a temporary folder renamed into place whole: a failed write leaves the
    previous model and no partial folder), then log it as the run's model (``log_model``).
    Returns the local folder."""
    from orchard.storage import atomic_folder

    path = Path(ctx.run_dir) / MODEL_DIR
    if path.exists() and not (path / "MLmodel").is_file():  # something of the user's in a folder they named (hydra.run.dir): never deleted
        path = Path(ctx.run_dir) / f"{MODEL_DIR}-{ctx.run_id or os.getpid()}"
    metadata = {"orchard_workload": workload, "orchard_run_id": ctx.run_id or "", **(extra_metadata or {})}
    with atomic_folder(path) as partial:   # the previous model or the new one, never half of one
        write(partial, metadata)
    if ctx.run_id and ctx.tracking_uri:
        model_id = log_model(path, ctx.run_id, ctx.tracking_uri, workload)
        ctx.set_tags({"orchard.model_uri": f"runs:/{ctx.run_id}/{MODEL_DIR}", "orchard.logged_model": f"models:/{model_id}"})
    return path


def log_model(path: Path, run_id: str, tracking_uri: str, workload: str) -> str:
    """Log the model folder ``path`` as the run's model through MLflow's own ``Model.log`` (what
    ``mlflow.<flavour>.log_model(name="model")`` calls): an MLflow 3 LoggedModel named ``model``,
    recorded as the run's output (the run page's "Logged models"), with the run's params, so
    ``runs:/<run id>/model`` and ``models:/<model id>`` both load it.  The folder's ``MLmodel``
    gets the LoggedModel's ids too (a predict run records the model it used by them).  Returns
    the model id."""
    import mlflow
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model
    from mlflow.tracking import MlflowClient

    # Model.log would create the LoggedModel in MLflow's *current* experiment (Default, for a run
    # made through a client): made here in the run's own, it is handed over by id
    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    model = client.create_logged_model(run.info.experiment_id, name=MODEL_DIR, source_run_id=run_id,
                                       params=run.data.params, tags={"orchard.workload": workload})
    mlflow.set_tracking_uri(tracking_uri)   # Model.log writes to MLflow's current store
    try:
        # No run_id here: given one, Model.log links to the model every metric the run has at
        # its step 0 (the first resource samples, cluster/*, train/restarts: what the model's page
        # then listed as its metrics). The model is recorded as the run's output below instead,
        # and its quality figures are linked when the run ends (link_quality).
        info = Model.log(artifact_path=None, name=MODEL_DIR, flavor=_WrittenModel(path, run_id), run_id=None,
                         model_id=model.model_id, validate_serving_input=False)  # predicted on its example already
        client.log_outputs(run_id, models=[LoggedModelOutput(model.model_id, step=0)])
    except Exception:   # never left PENDING: the UI shows it failed, the run's error says why
        from mlflow.entities import LoggedModelStatus

        client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        raise
    written = Model.load(str(path))
    written.run_id, written.model_id, written.model_uuid = run_id, info.model_id, info.model_uuid
    written.save(str(path / "MLmodel"))
    return info.model_id


class _WrittenModel:
    """The flavour ``Model.log`` saves with: its ``save_model`` copies the folder the workload's
    own flavour already wrote (``mlflow.pytorch.save_model``, ``mlflow.pyfunc.save_model``) and
    stamps the LoggedModel's ids into its ``MLmodel``, so MLflow's logging path (LoggedModel,
    run output, upload) runs unchanged on it."""

    __name__ = "orchard"

    def __init__(self, folder: Path, run_id: str):
        self.folder, self.run_id = folder, run_id

    def save_model(self, path: str, mlflow_model, **_flavour_args) -> None:
        from mlflow.models import Model

        shutil.copytree(self.folder, path, ignore=shutil.ignore_patterns("__pycache__"))
        written = Model.load(path)
        written.run_id, written.model_id = self.run_id, mlflow_model.model_id
        written.model_uuid, written.artifact_path = mlflow_model.model_uuid, mlflow_model.artifact_path
        written.save(str(Path(path) / "MLmodel"))
        vars(mlflow_model).update(vars(written))   # what Model.log reports (signature, flavours) is the folder's


def model_id_of(model_dir: Path) -> str | None:
    """The LoggedModel id a model folder was logged as (its ``MLmodel``), if any."""
    import yaml

    try:
        found = yaml.safe_load((Path(model_dir) / "MLmodel").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return (found.get("model_id") or None) if isinstance(found, dict) else None


def record_model_input(ctx, model_dir: Path) -> None:
    """A predict run's input: the LoggedModel it applies (run page: "Logged models"), when the
    model was logged to this run's store."""
    model_id = model_id_of(model_dir)
    if not (model_id and ctx.run_id and ctx.tracking_uri):
        return
    from mlflow.entities import LoggedModelInput
    from mlflow.tracking import MlflowClient

    client = MlflowClient(ctx.tracking_uri)
    try:
        client.get_logged_model(model_id)
    except Exception:  # a model folder from another store: nothing here to link
        return
    client.log_inputs(ctx.run_id, models=[LoggedModelInput(model_id)])


def save_pyfunc(path: Path, metadata: dict, loader_module: str, data_path: Path, input_example, output_example,
                free_inputs: Iterable[int] = (0,), free_outputs: Iterable[int] = (0,)) -> None:
    """A pickle-free pyfunc model: ``loader_module._load_pyfunc(<data folder>)`` rebuilds it
    from plain files (npz, json, torch state dicts).  The signature is inferred from the
    example input and output, with the dimensions that hold a count or an image size left free (-1): the
    example's shape is a count or an image size (``free_inputs``/``free_outputs``), so new
    inputs of another size pass the schema.

    The model travels: its ``code/`` holds the loader's workload package (``workloads/<name>``),
    and its requirements pin what that loader imports (the package's ``MODEL_IMPORTS``), so
    ``mlflow.pyfunc.load_model`` works in a fresh environment built from ``requirements.txt``
    alone, without orchard or this checkout."""
    import importlib
    import tempfile
    import warnings

    import mlflow
    from mlflow.models import infer_signature

    package = loader_module.rsplit(".", 1)[0]
    imports = getattr(importlib.import_module(package), "MODEL_IMPORTS", ())
    with tempfile.TemporaryDirectory(prefix="orchard-code-") as tmp, warnings.catch_warnings():
        # the examples are the model's own input and output: a table's whole-number columns (ranks,
        # indices, labels) never hold missing values, so MLflow's hint that integers cannot is not
        # the user's to read in every run's log
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer column")
        signature = free_dims(infer_signature(input_example, output_example), free_inputs, free_outputs)
        code = _package_copy(package, Path(tmp))
        mlflow.pyfunc.save_model(str(path), loader_module=loader_module, data_path=str(data_path),
                                 code_paths=[str(code)], signature=signature, input_example=input_example,
                                 pip_requirements=pip_requirements(imports), metadata=metadata)


def _package_copy(package: str, into: Path) -> Path:
    """``workloads/forest`` (and the ``workloads/__init__.py`` above it) copied into ``into``,
    without byte code: the top folder to give MLflow's ``code_paths``, which puts it on
    ``sys.path`` as ``code/workloads``, so ``workloads.forest.predict`` imports as here."""
    import importlib

    top, _, _ = package.partition(".")
    src = Path(list(importlib.import_module(top).__path__)[0])   # a namespace package has no __file__
    dst = into / top
    inner = package.split(".")[1:]
    if not inner:
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        return dst
    dst.mkdir(parents=True)
    if (src / "__init__.py").is_file():
        shutil.copy(src / "__init__.py", dst / "__init__.py")
    shutil.copytree(src.joinpath(*inner), dst.joinpath(*inner), ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def free_dims(signature, inputs: Iterable[int] = (), outputs: Iterable[int] = ()):
    """A copy of a tensor signature with the given dimensions (of the first input / output)
    made free (-1): images and videos of any size."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def loosen(schema, dims):
        if not dims:  # kept as inferred (a table's columns, say)
            return schema
        spec = schema.inputs[0]
        shape = list(spec.shape)
        for d in dims:
            shape[d] = -1
        return Schema([TensorSpec(spec.type, tuple(shape), spec.name)])

    return ModelSignature(loosen(signature.inputs, inputs), loosen(signature.outputs, outputs))


QUALITY = ("headline/", "test/", "val/")  # what a model is judged by; time, speed and system are the run's


def link_quality(client, run_id: str) -> int:
    """The run's quality figures (``headline/``, ``test/``, ``val/``: each key's last value) also
    on its LoggedModel, measured on the run's dataset input: the model's page lists its metrics
    and "Datasets used", and ``search_logged_models`` ranks models by them. Each is the run's own
    last record logged again with the model's id and the dataset, so the run's history gains no
    point (the store keeps one row for an identical record). Returns how many were linked."""
    from mlflow.entities import Metric

    run = client.get_run(run_id)
    model = run.data.tags.get("orchard.logged_model", "")
    if not model.startswith("models:/"):
        return 0
    inputs = run.inputs.dataset_inputs if run.inputs else []
    dataset = inputs[0].dataset if inputs else None
    linked = []
    for key in sorted(k for k in run.data.metrics if k.startswith(QUALITY)):
        last = max(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp), default=None)
        if last is not None:
            linked.append(Metric(key, last.value, last.timestamp, last.step, model_id=model[len("models:/"):],
                                 dataset_name=dataset.name if dataset else None,
                                 dataset_digest=dataset.digest if dataset else None))
    for i in range(0, len(linked), 1000):  # the store's batch limit
        client.log_batch(run_id, metrics=linked[i:i + 1000])
    return len(linked)
