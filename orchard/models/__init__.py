"""Trained models as MLflow Models, and what ``mode=predict`` shares across the four workloads.

Training ends with one call, ``save_model(ctx, workload, write)`` (orchard/models/logged.py): the
workload writes an MLflow Model into ``<run folder>/model`` (flower: MLflow's PyTorch flavour;
forest, video, singa: a ``pyfunc`` whose ``loader_module`` is the workload's ``predict.py``, with
the workload's package in its ``code/`` and its requirements pinned: ``save_pyfunc``), logged
through MLflow's own ``Model.log`` as the run's output, a LoggedModel named ``model``, so
``mlflow.pyfunc.load_model("runs:/<id>/model")`` works in a fresh process without Ray, and in a
fresh environment built from the model's ``requirements.txt`` without orchard.  Parameters are
``.npz`` arrays or ``torch`` state dicts (flower: a ``torch.export`` program), never a pickle of
our objects; every model's ``MLmodel`` metadata names its workload (``orchard_workload``), so a
model of another workload is refused (exit 2).

``python -m orchard workload=<w> mode=predict model=<runs:/... | models:/name/version | path>
input=<file or folder>`` resolves the model here (``resolve_model``, ``settings_file``,
``trusted_modules``); the workload's predict.py then runs the batch over the files
(orchard/models/batch_predict.py), its predictor loading the settings file found here. The model
registry (``register``, ``register_best`` for sweeps) is here too.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from orchard.config import MODEL_SCHEMES  # mode/model/input are checked with the config (orchard/config/__init__.py)
from orchard.terminal.console import say
from orchard.errors import ConfigError
# writing and logging a model (orchard/models/logged.py); the workloads' predict.py import these from here
from orchard.models.logged import (MODEL_DIR, free_dims, pip_requirements, record_model_input,  # noqa: F401
                                   save_model, save_pyfunc)


# --------------------------------------------------------------------------- resolving model=
def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def resolve_model(spec: str, workload: str, tracking_uri: str | None, scratch: Path) -> tuple[Path, dict]:
    """``model=`` -> (local MLflow Model folder, its orchard metadata).

    ``runs:/<id>/model`` and ``models:/<name>/<version>`` are downloaded from the run's store
    into ``scratch``; a path is a model folder (holding ``MLmodel``) or a train run's folder
    (holding ``model/MLmodel``).  Raises ConfigError naming ``model`` for anything else,
    including a model another workload trained."""
    import yaml

    spec = str(spec)
    if spec.startswith(MODEL_SCHEMES):
        import mlflow

        try:
            if tracking_uri:
                mlflow.set_tracking_uri(tracking_uri)
                mlflow.set_registry_uri(tracking_uri)
            scratch.mkdir(parents=True, exist_ok=True)
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=spec, dst_path=str(scratch),
                                                             tracking_uri=tracking_uri))
        except Exception as exc:  # unknown run, version or name: one line, exit 2
            raise ConfigError("model", f"a model the tracking store holds; {spec}: {_one_line(exc)}") from None
    else:
        local = Path(os.path.expanduser(spec))
        if not (local / "MLmodel").is_file() and (local / MODEL_DIR / "MLmodel").is_file():
            local = local / MODEL_DIR
    if not (local / "MLmodel").is_file():
        raise ConfigError("model", f"an MLflow Model (a folder with an MLmodel file); {spec} has none")
    meta = (yaml.safe_load((local / "MLmodel").read_text()) or {}).get("metadata") or {}
    owner = meta.get("orchard_workload")
    if owner is None:
        raise ConfigError("model", f"a model an orchard {workload} run logged; {spec} has no orchard_workload metadata")
    if owner != workload:
        raise ConfigError("model", f"a {workload} model; {spec} is a {owner} model (use workload={owner})")
    return local, meta


# --------------------------------------------------------------------------- inputs and outputs
def settings_file(model_dir: Path, name: str) -> str:
    """The one file called ``name`` in a model folder, as a path relative to it: what is checked
    (``trusted_modules``) and what the loader opens are then the same file. A folder with none,
    or with more than one (a second one planted beside the real one), is refused: ConfigError
    naming ``model``, exit 2."""
    found = sorted(p.relative_to(model_dir).as_posix() for p in Path(model_dir).rglob(name))
    if len(found) != 1:
        listed = f": {', '.join(found[:4])}" if found else ""
        raise ConfigError("model", f"a model folder holding one {name}; {model_dir} holds {len(found)}{listed}")
    return found[0]


def trusted_modules(settings: Path, key: str, given, config_key: str) -> None:
    """Refuse a model that would import modules the user did not name. A model's settings
    (``settings``: the file ``settings_file`` found, which the loader then opens) list the Python
    modules its loader imports (a user's layers, extractors); importing runs their code, and a
    model comes from a store or bucket teammates can write. So predict imports only modules the
    user names too (``config_key`` on the command line or in their config): one line naming them
    otherwise, exit 2, before anything is loaded."""
    import json

    named = json.loads(Path(settings).read_text()).get(key) or []
    untrusted = sorted(set(map(str, named)) - set(map(str, given or [])))
    if untrusted:
        listed = ",".join(untrusted)
        raise ConfigError(config_key, f"the model imports {listed} when it loads, which runs their code; "
                                      f"to trust them name them yourself: {config_key}=[{listed}]")


# --------------------------------------------------------------------------- registry (sweeps)
def register(model_uri: str, name: str, tracking_uri: str, tags: dict | None = None) -> str:
    """Put ``model_uri`` in the MLflow Model Registry under ``name`` with ``tags``; returns
    ``models:/<name>/<version>``."""
    from mlflow.tracking import MlflowClient

    import mlflow

    mlflow.set_registry_uri(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    try:
        client.get_registered_model(name)
    except Exception:
        client.create_registered_model(name)
    run_id = model_uri.split("/")[1] if model_uri.startswith("runs:/") else None
    model_id = _run_model_id(client, run_id) if run_id else None
    if model_id:   # the run's LoggedModel: the version links to it (the UI's model page)
        source = f"models:/{model_id}"
    else:          # a run that logged its model as an artifact folder (before orchard used Model.log)
        source = client.get_run(run_id).info.artifact_uri + "/" + MODEL_DIR if run_id else model_uri
    version = client.create_model_version(name, source, run_id=run_id, model_id=model_id,
                                          tags={k: str(v)[:5000] for k, v in (tags or {}).items()})
    return f"models:/{name}/{version.version}"


def _run_model_id(client, run_id: str) -> str | None:
    """The id of the LoggedModel a run logged as its output, if any."""
    outputs = client.get_run(run_id).outputs
    models = outputs.model_outputs if outputs else []
    return models[-1].model_id if models else None


def register_best(tracking_uri: str, name: str, best: dict, metric: str, parent_run_id: str | None = None) -> str:
    """``sweep.register=<name>``: the best trial's model (``best``: a leaderboard row) in the
    Model Registry, tagged with the trial's metric, its swept config values and run id; the
    sweep's parent run gets the tag ``orchard.registered_model``.  Returns the model URI."""
    tags = {"orchard.metric": metric, metric: best["metric"], "orchard.trial_run_id": best["run_id"],
            **{f"config.{k}": v for k, v in best["params"].items()}}
    uri = register(f"runs:/{best['run_id']}/{MODEL_DIR}", name, tracking_uri, tags)
    if parent_run_id:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri).set_tag(parent_run_id, "orchard.registered_model", uri)
    say(f"orchard: registered the best trial's model as {uri}", file=sys.stderr)
    return uri
