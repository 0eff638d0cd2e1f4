"""orchard/models/__init__.py: the mode/model/input keys, resolving ``model=``, and the shared predict
plumbing (Ray Data actor pool, skipped files) on a real pyfunc model saved here."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchard import ConfigError
from orchard.config import compose, validate

ROOT = Path(__file__).resolve().parents[3]


def _validated(*overrides):
    import workloads.forest as forest

    cfg = compose(["workload=forest", *overrides])
    validate(cfg, forest)
    return cfg


@pytest.mark.parametrize("overrides, key, words", [
    (["mode=serve"], "mode", "one of train, predict"),
    (["mode=predict", "input=."], "model", "runs:/<run id>/model"),
    (["mode=predict", "model=/no/such/model", "input=."], "model", "runs:/<run id>/model"),
    (["mode=predict", "model=runs:/abc/model"], "input", "a file or folder"),
    (["mode=predict", "model=runs:/abc/model", "input=/no/such/folder"], "input", "does not exist"),
])
def test_bad_mode_model_or_input_is_one_config_error(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        _validated(*overrides)
    assert err.value.key == key and words in err.value.allowed


def test_the_cli_says_one_line_and_exits_2_before_ray_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "orchard", "workload=forest", "mode=predict", "input=/no/such/x",
                           "model=runs:/abc/model", f"output_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert "orchard: bad config: input: an existing path" in proc.stderr and "Traceback" not in proc.stderr


def _forest_model(tmp_path: Path) -> Path:
    """A real forest pyfunc model folder: one stump that calls every pixel part 0."""
    import mlflow

    from workloads.forest.predict import FOREST_FILE, SETTINGS_FILE, example_depth

    data = tmp_path / "data"
    data.mkdir()
    dist = np.zeros((1, 31), np.float32)
    dist[0, 0] = 1
    np.savez(data / FOREST_FILE, offsets=np.zeros((1, 4), np.float32), threshold=np.zeros(1, np.float32),
             left=np.array([-1], np.int32), right=np.array([-1], np.int32), dist=dist, roots=np.array([0], np.int32))
    (data / SETTINGS_FILE).write_text(json.dumps({"background_mm": 10000.0, "palette": [[i, i, i] for i in range(32)]}))
    path = tmp_path / "model"
    from orchard.models import save_pyfunc

    example = example_depth()
    save_pyfunc(path, {"orchard_workload": "forest"}, "workloads.forest.predict", data, example,
                np.zeros(example.shape, np.uint8), free_inputs=(0, 1, 2), free_outputs=(0, 1, 2))
    assert mlflow.pyfunc.load_model(str(path)).predict(example)[0][example[0] > 0].tolist() == [0] * int((example[0] > 0).sum())
    return path


@pytest.mark.slow
def test_resolve_model_takes_a_model_folder_or_a_run_folder_and_refuses_others(tmp_path):
    from orchard.models import resolve_model

    path = _forest_model(tmp_path)
    local, meta = resolve_model(str(path), "forest", None, tmp_path / "scratch")
    assert local == path and meta["orchard_workload"] == "forest"
    assert resolve_model(str(tmp_path), "forest", None, tmp_path / "scratch")[0] == path  # a run folder
    with pytest.raises(ConfigError, match="a singa model; .* is a forest model"):
        resolve_model(str(path), "singa", None, tmp_path / "scratch")
    with pytest.raises(ConfigError, match="an MLflow Model"):
        resolve_model(str(tmp_path / "data"), "forest", None, tmp_path / "scratch")
    with pytest.raises(ConfigError) as err:
        resolve_model("runs:/0123456789abcdef/model", "forest", f"sqlite:///{tmp_path}/m.db", tmp_path / "scratch")
    assert err.value.key == "model"


@pytest.mark.slow
def test_predict_files_runs_an_actor_pool_and_counts_bad_files(ray_session, tmp_path):
    import cv2

    from orchard import models

    from orchard.models import batch_predict
    from orchard.storage import Storage
    from workloads.forest.predict import Predictor

    class Ctx:  # what predict_files and report use of a RunContext; tracking off
        run_dir, run_id, tracking_uri = tmp_path, None, None
        seen = []

        def progress(self, step, total, desc="", **rates):
            self.seen.append((step, total, rates))

    path = _forest_model(tmp_path)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(5):
        cv2.imwrite(str(inputs / f"d{i}.png"), (np.arange(48 * 32).reshape(48, 32) % 3 * 1000).astype(np.uint16))
    (inputs / "e.png").write_text("not an image")
    out = batch_predict.output_dir(Ctx())
    (out / "labels").mkdir()
    files = batch_predict.input_files(inputs, (".png",))
    ctx = Ctx()
    store = Storage(tmp_path / "store")
    rows = batch_predict.predict_files(files, Predictor, {"settings": models.settings_file(path, "forest.json")}, ctx,
                                       store, path, out, batch_size=2)
    assert [Path(r["path"]).name for r in rows] == [f.name for f in files]
    assert not store.exists(batch_predict.STAGING_DIR)  # the staged copies are gone; the inputs stay
    assert len(list(inputs.iterdir())) == 6
    metrics = batch_predict.report(rows, ["path", "width", "height"], ctx, out, "images", 1.0)
    assert metrics["predict/images"] == 5 and metrics["predict/skipped"] == 1
    assert ctx.seen[-1][0] == 6 and ctx.seen[-1][1] == 6 and ctx.seen[-1][2]["items/s"] > 0
    with open(out / "skipped.csv") as f:
        assert [r["file"] for r in csv.DictReader(f)] == ["e.png"]
    assert len(list((out / "labels").glob("*.png"))) == 5
    with pytest.raises(ConfigError, match="readable images"):
        batch_predict.report([r for r in rows if r["error"]], ["path"], ctx, out, "images", 1.0)


@pytest.mark.slow
def test_register_best_puts_the_trials_model_in_the_registry_with_its_metric_and_config(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchard.models import register_best

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri, registry_uri=uri)  # not a registry another test set globally
    exp = client.create_experiment("sweep", artifact_location=(tmp_path / "art").as_uri())
    trial, parent = client.create_run(exp), client.create_run(exp)
    client.log_artifacts(trial.info.run_id, str(_forest_model(tmp_path)), "model")
    best = {"run_id": trial.info.run_id, "metric": 0.42, "params": {"forest.num_trees": 2}}
    got = register_best(uri, "body-parts", best, "test/mean_class_accuracy", parent.info.run_id)
    assert got == "models:/body-parts/1"
    version = client.get_model_version("body-parts", "1")
    assert version.tags["test/mean_class_accuracy"] == "0.42" and version.tags["config.forest.num_trees"] == "2"
    assert version.run_id == trial.info.run_id
    assert client.get_run(parent.info.run_id).data.tags["orchard.registered_model"] == got
    import mlflow

    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(got)
    assert model.metadata.metadata["orchard_workload"] == "forest"


@pytest.mark.slow
def test_a_training_run_logs_an_mlflow_logged_model_too(cli_run, tmp_path):
    """MLflow 3's LoggedModel (the UI's Models tab, search_logged_models, models:/<id>): the run's
    model, logged through MLflow's own Model.log, reachable as runs:/<id>/model and models:/<id>,
    downloadable and owned by the workload, with the run's quality figures and dataset linked."""
    import mlflow

    from orchard.models import resolve_model

    run = cli_run("workload=singa", "singa.arch=local")
    assert run.exit_code == 0, run.console[-2000:]
    exps = [e.experiment_id for e in run.client.search_experiments()]
    mine = [m for m in mlflow.MlflowClient(run.uri).search_logged_models(exps)
            if m.source_run_id == run.run_id]
    assert len(mine) == 1 and str(mine[0].status).endswith("READY"), mine
    uri = run.run.data.tags["orchard.logged_model"]
    assert uri == f"models:/{mine[0].model_id}"
    assert mine[0].name == "model" and [o.model_id for o in run.run.outputs.model_outputs] == [mine[0].model_id]
    # what it scored, on which data: the run's quality figures on the model, with the run's dataset
    linked = {m.key: m for m in mine[0].metrics}
    assert "test/accuracy" in linked and linked["test/accuracy"].value == run.run.data.metrics["test/accuracy"]
    dataset = run.run.inputs.dataset_inputs[0].dataset
    assert {(m.dataset_name, m.dataset_digest) for m in linked.values()} == {(dataset.name, dataset.digest)}
    assert not [k for k in linked if k.startswith(("system/", "time/", "train/"))]
    # runs:/<id>/model lists through the LoggedModel (MLflow 3.17 resolves it on its *current* store)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(run.uri)
    try:
        listed = mlflow.artifacts.list_artifacts(artifact_uri=f"runs:/{run.run_id}/model", tracking_uri=run.uri)
    finally:
        mlflow.set_tracking_uri(previous)  # other tests' stores stay theirs
    assert any(a.path.endswith("MLmodel") for a in listed)
    # the run folder's copy names the LoggedModel (a predict run given that folder records it as input)
    from orchard.models.logged import model_id_of

    assert model_id_of(run.run_dir / "model") == mine[0].model_id
    local, meta = resolve_model(uri, "singa", run.uri, tmp_path / "dl")
    assert (local / "MLmodel").is_file() and meta["orchard_workload"] == "singa"



@pytest.mark.slow
def test_predict_files_actors_read_staged_copies_never_the_drivers_paths(ray_session, tmp_path):
    """Workers on another node cannot open the driver's files: the model, every input and its
    companions reach the actors through the storage location, and what they write comes back."""
    from orchard import models
    from orchard.models import batch_predict
    from orchard.storage import Storage

    class Ctx:
        run_dir, run_id, tracking_uri = tmp_path, None, None

        def progress(self, *args, **kwargs):
            pass

    class SeenPaths:  # local: pickled by value into the actors
        """A predictor that says which path it was given and writes one output file per input."""

        def __init__(self, model_dir: str, out_dir: str, tag: str):
            self.model_files = sorted(p.name for p in Path(model_dir).iterdir())
            self.out, self.tag = Path(out_dir), tag

        def __call__(self, batch: dict) -> dict:
            seen = [str(p) for p in batch["path"]]
            for p in seen:
                companions = sorted(q.name for q in Path(p).parent.iterdir())
                (self.out / "notes" / f"{Path(p).stem}.txt").write_text(f"{self.tag} {Path(p).read_text()} {companions}")
            return {"path": np.asarray(seen), "error": np.asarray([""] * len(seen)), "seen": np.asarray(seen),
                    "model_files": np.asarray([",".join(self.model_files)] * len(seen))}

    model = tmp_path / "model"
    model.mkdir()
    (model / "MLmodel").write_text("x")
    inputs = tmp_path / "in" / "7"   # a class folder: its name travels with the input
    inputs.mkdir(parents=True)
    for i in range(3):
        (inputs / f"a{i}.txt").write_text(f"input{i}")
        (inputs / f"a{i}.truth").write_text("t")
    out = batch_predict.output_dir(Ctx())
    (out / "notes").mkdir()
    files = sorted(inputs.glob("*.txt"))
    store = Storage(tmp_path / "store")
    rows = batch_predict.predict_files(files, SeenPaths, {"tag": "ok"}, Ctx(), store, model, out,
                                companions=lambda p: [p.with_suffix(".truth")], batch_size=2)
    assert [r["path"] for r in rows] == [str(f) for f in files]    # reported by the user's names
    for r, f in zip(rows, files):
        seen = Path(r["seen"])
        assert seen != f and seen.name == f.name and seen.parent.name == "7"
        assert r["model_files"] == "MLmodel,_COMPLETE"
    for i in range(3):   # written on the actor's node, sent back, written here
        assert (out / "notes" / f"a{i}.txt").read_text() == f"ok input{i} ['a{i}.truth', 'a{i}.txt']"
    assert not store.exists(batch_predict.STAGING_DIR)


def test_predict_imports_only_the_modules_the_user_names_not_those_a_model_names(tmp_path):
    """A model from a shared store that names modules to import (a teammate's layers) would run
    their code in whoever predicts with it: refused in one line unless the user names them too."""
    import json

    from orchard.errors import ConfigError
    from orchard.models import trusted_modules

    (tmp_path / "model" / "net").mkdir(parents=True)
    net = tmp_path / "model" / "net" / "net.json"
    net.write_text(json.dumps({"layer_modules": ["evil.layers"]}))
    with pytest.raises(ConfigError) as refused:
        trusted_modules(net, "layer_modules", [], "singa.layer_modules")
    assert refused.value.key == "singa.layer_modules" and "singa.layer_modules=[evil.layers]" in str(refused.value)
    trusted_modules(net, "layer_modules", ["evil.layers"], "singa.layer_modules")
    net.write_text(json.dumps({"layer_modules": []}))
    trusted_modules(net, "layer_modules", [], "singa.layer_modules")


def test_a_model_folder_with_a_second_settings_file_is_refused_and_the_loader_gets_the_checked_one(tmp_path):
    """The trust check and the loader read one file, found once: a harmless ``net.json`` planted
    beside the real one (which names a module to import) is refused, not checked in its stead."""
    import json

    from orchard.errors import ConfigError
    from orchard.models import settings_file
    from workloads.forest.predict import Predictor

    model = tmp_path / "model"
    (model / "data").mkdir(parents=True)
    np.savez(model / "data" / "forest.npz", offsets=np.zeros((1, 4), np.float32), threshold=np.zeros(1, np.float32),
             left=np.array([-1], np.int32), right=np.array([-1], np.int32), dist=np.ones((1, 31), np.float32),
             roots=np.array([0], np.int32))
    (model / "data" / "forest.json").write_text(json.dumps({"background_mm": 1e4, "palette": [[7, 7, 7]] * 32}))
    found = settings_file(model, "forest.json")
    assert found == "data/forest.json"
    predictor = Predictor(str(model), str(tmp_path / "out"), found)   # loads the file named, no search of its own
    assert predictor.model.palette[0].tolist() == [7, 7, 7]
    for rel, named in (("data/a/net.json", []), ("data/net/net.json", ["rt_evil_mod"])):
        (tmp_path / "m" / rel).parent.mkdir(parents=True)
        (tmp_path / "m" / rel).write_text(json.dumps({"layer_modules": named}))
    with pytest.raises(ConfigError) as refused:
        settings_file(tmp_path / "m", "net.json")
    assert refused.value.key == "model" and "holds 2" in str(refused.value) and "data/net/net.json" in str(refused.value)
    with pytest.raises(ConfigError, match="holds 0"):
        settings_file(tmp_path / "m", "video.json")


def test_an_input_linked_from_outside_the_input_folder_is_skipped_and_counted_never_opened(tmp_path):
    from orchard.tracking import skipped

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.png").write_bytes(b"a")
    (tmp_path / "in" / "passwd.png").symlink_to("/etc/passwd")
    (tmp_path / "in" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    good, bad = skipped.readable(skipped.listed_inputs(tmp_path / "in", (".png",)), tmp_path / "in")
    assert [p.name for p in good] == ["a.png"]
    assert [(s.file, s.kind) for s in bad] == [("gone.png", "missing"), ("passwd.png", "outside_folder")]
    assert skipped.readable([tmp_path / "in" / "passwd.png"], tmp_path / "in" / "passwd.png")[0]  # a file named: taken


def test_an_input_that_vanishes_after_listing_is_skipped_with_its_reason_and_the_rest_predicted(ray_session, tmp_path):
    """A file listed, then removed before it was staged (a sync client, a user tidying up): the
    predict run lists it as skipped (kind ``missing``) and predicts the others."""
    from orchard import models
    from orchard.models import batch_predict
    from orchard.tracking import skipped
    from orchard.storage import Storage

    class Ctx:
        run_dir, run_id, tracking_uri = tmp_path, None, None

        def progress(self, *args, **kwargs):
            pass

    class Length:  # local: pickled by value into the actors
        def __init__(self, model_dir: str, out_dir: str):
            pass

        def __call__(self, batch: dict) -> dict:
            paths = [str(p) for p in batch["path"]]
            return {"path": np.asarray(paths), "error": np.asarray([""] * len(paths)),
                    "chars": np.asarray([len(Path(p).read_text()) for p in paths])}

    model = tmp_path / "model"
    model.mkdir()
    (model / "MLmodel").write_text("x")
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(3):
        (inputs / f"a{i}.txt").write_text("x" * (i + 1))
    files = batch_predict.input_files(inputs, (".txt",))
    (inputs / "a1.txt").unlink()                      # gone between listing and staging
    out = batch_predict.output_dir(Ctx())
    store = Storage(tmp_path / "store")
    rows = batch_predict.predict_files(files, Length, {}, Ctx(), store, model, out, batch_size=2)
    assert [(Path(r["path"]).name, r["error"][:11], r.get("chars")) for r in rows] == [
        ("a0.txt", "", 1), ("a1.txt", "not staged:", None), ("a2.txt", "", 3)]
    assert skipped.from_rows(rows)[0][:2] == ("a1.txt", "missing")
    assert not store.exists(batch_predict.STAGING_DIR)
    metrics = batch_predict.report(rows, ["path", "chars"], Ctx(), out, "files", 1.0)
    assert metrics["predict/files"] == 2 and metrics["predict/skipped"] == 1
    with open(out / "skipped.csv") as f:
        assert [r["file"] for r in csv.DictReader(f)] == ["a1.txt"]
