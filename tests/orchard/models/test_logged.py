"""orchard/models/logged.py on its own: a model folder written whole into the run folder, logged
as the run's MLflow 3 LoggedModel (or marked FAILED), recorded as a predict run's input, and what
it carries to travel (pinned requirements, the workload's package, a signature for any size). A
real sqlite store in tmp_path read back with MlflowClient; a minimal MLmodel stands for a
workload's flavour (the workloads' own models: test_models.py and each workload's tests). No Ray."""
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchard.models import logged as logged_models
from orchard.tracking.store import check_store


class Ctx:
    """What ``save_model`` and ``record_model_input`` use of a RunContext; its tags go straight to
    the store (a RunContext sends them through the run's sink actor)."""

    def __init__(self, run_dir: Path, run_id: str | None = None, tracking_uri: str | None = None):
        self.run_dir, self.run_id, self.tracking_uri = run_dir, run_id, tracking_uri

    def set_tags(self, tags: dict) -> None:
        for key, value in tags.items():
            MlflowClient(self.tracking_uri).set_tag(self.run_id, key, value)


def write_model(path: Path, metadata: dict) -> None:
    """A workload's flavour at its smallest: an MLmodel with orchard's metadata and one weights file."""
    from mlflow.models import Model

    path.mkdir(parents=True, exist_ok=True)
    (path / "weights.txt").write_text("w1")
    Model(metadata=metadata).save(str(path / "MLmodel"))


@pytest.fixture
def store(tmp_path):
    """``(client, experiment id)`` on a new sqlite store, its artifacts in tmp_path."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_store(uri)
    client = MlflowClient(uri)
    previous = mlflow.get_tracking_uri()
    yield client, client.create_experiment("models", artifact_location=(tmp_path / "artifacts").as_uri())
    mlflow.set_tracking_uri(previous)   # log_model points MLflow's current store here: other tests keep theirs


def test_a_model_is_written_into_the_run_folder_with_the_workload_and_run_in_its_metadata(tmp_path):
    seen = {}

    def write(path: Path, metadata: dict) -> None:
        seen.update(metadata)
        write_model(path, metadata)

    path = logged_models.save_model(Ctx(tmp_path), "tiny", write, {"classes": 3})
    assert path == tmp_path / "model" and (path / "weights.txt").read_text() == "w1"
    assert seen == {"orchard_workload": "tiny", "orchard_run_id": "", "classes": 3}


def test_a_failed_write_keeps_the_previous_model_and_leaves_no_partial_folder(tmp_path):
    logged_models.save_model(Ctx(tmp_path), "tiny", write_model)

    def dies_halfway(path: Path, metadata: dict) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "weights.txt").write_text("half")
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        logged_models.save_model(Ctx(tmp_path), "tiny", dies_halfway)
    assert (tmp_path / "model" / "weights.txt").read_text() == "w1"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_users_folder_named_model_that_holds_no_model_is_never_replaced(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    path = logged_models.save_model(Ctx(tmp_path, run_id="abc123"), "tiny", write_model)
    assert path == tmp_path / "model-abc123" and (path / "MLmodel").is_file()
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["notes.txt"]


def test_a_tracked_runs_model_is_its_logged_model_by_both_uris_with_the_runs_params(store, tmp_path):
    client, exp = store
    run_id = client.create_run(exp).info.run_id
    client.log_param(run_id, "tiny.lr", "0.05")
    path = logged_models.save_model(Ctx(tmp_path / "run", run_id, client.tracking_uri), "tiny", write_model)
    tags = client.get_run(run_id).data.tags
    model_id = logged_models.model_id_of(path)
    assert tags["orchard.model_uri"] == f"runs:/{run_id}/model" and tags["orchard.logged_model"] == f"models:/{model_id}"
    model = client.get_logged_model(model_id)
    assert str(model.status).endswith("READY") and model.name == "model" and model.source_run_id == run_id
    assert model.params == {"tiny.lr": "0.05"} and model.tags["orchard.workload"] == "tiny"
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [model_id]


def test_the_runs_quality_figures_are_linked_to_its_model_with_its_dataset_and_its_history_untouched(store, tmp_path):
    import time

    from mlflow.entities import Dataset, DatasetInput, Metric

    client, exp = store
    run_id = client.create_run(exp).info.run_id
    # a run's data as orchard/tracking/datasets.py records it: a named dataset with a digest
    fields = Dataset(name="fields", digest="abc123", source_type="code", source="{}")
    client.log_inputs(run_id, datasets=[DatasetInput(fields)])
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric("val/mae", 3.0, now, 0), Metric("val/mae", 2.0, now + 1, 1),
                                      Metric("headline/count_mae", 2.5, now + 2, 1), Metric("train/loss", 0.1, now, 1)])
    assert logged_models.link_quality(client, run_id) == 0  # no model logged: nothing to link
    logged_models.save_model(Ctx(tmp_path / "run", run_id, client.tracking_uri), "tiny", write_model)
    assert logged_models.link_quality(client, run_id) == 2
    model = client.get_logged_model(logged_models.model_id_of(tmp_path / "run" / "model"))
    linked = {m.key: m for m in model.metrics}
    assert set(linked) == {"val/mae", "headline/count_mae"}  # the run's loss is no model quality
    assert linked["val/mae"].value == 2.0 and linked["val/mae"].dataset_name == "fields"
    assert linked["val/mae"].dataset_digest == "abc123"
    assert [m.value for m in client.get_metric_history(run_id, "val/mae")] == [3.0, 2.0]  # no point added


def test_a_model_that_fails_to_log_is_marked_failed_not_left_pending(store, tmp_path):
    client, exp = store
    run_id = client.create_run(exp).info.run_id
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(Exception, match="MLmodel"):
        logged_models.log_model(tmp_path / "not-a-model", run_id, client.tracking_uri, "tiny")
    assert [str(m.status).rsplit(".", 1)[-1] for m in client.search_logged_models([exp])] == ["FAILED"]


def test_a_predict_run_records_the_model_it_applied_as_its_input(store, tmp_path):
    client, exp = store
    trained = client.create_run(exp).info.run_id
    path = logged_models.save_model(Ctx(tmp_path / "run", trained, client.tracking_uri), "tiny", write_model)
    predict = client.create_run(exp).info.run_id
    logged_models.record_model_input(Ctx(tmp_path / "p", predict, client.tracking_uri), path)
    assert [m.model_id for m in client.get_run(predict).inputs.model_inputs] == [logged_models.model_id_of(path)]


def test_a_model_logged_to_another_store_or_never_logged_is_no_input(store, tmp_path):
    client, exp = store
    predict = client.create_run(exp).info.run_id
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "MLmodel").write_text("flavors: {}\nmodel_id: m-from-another-store\n")
    assert logged_models.model_id_of(elsewhere) == "m-from-another-store"
    logged_models.record_model_input(Ctx(tmp_path / "p", predict, client.tracking_uri), elsewhere)
    assert client.get_run(predict).inputs.model_inputs == []
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "MLmodel").write_text("model_id: [unclosed")
    assert logged_models.model_id_of(tmp_path / "broken") is None and logged_models.model_id_of(tmp_path) is None


def test_requirements_pin_mlflow_numpy_and_what_the_loader_imports_as_installed():
    from importlib.metadata import version

    pins = logged_models.pip_requirements(("torch", "yaml", "numpy", "cv2"))
    # yaml's and cv2's distributions go by other names (video's and forest's loaders import cv2)
    assert pins == [f"mlflow=={version('mlflow')}", f"numpy=={version('numpy')}",
                    f"torch=={version('torch').split('+')[0]}", f"PyYAML=={version('PyYAML')}",
                    f"opencv-python-headless=={version('opencv-python-headless')}"]
    assert not any(p.startswith("orchard") or "+" in p for p in pins)


def test_a_signature_with_free_dimensions_takes_inputs_of_any_size():
    import numpy as np
    from mlflow.models import infer_signature

    signature = infer_signature(np.zeros((1, 32, 24, 3), np.uint8), np.zeros((1, 32, 24), np.uint8))
    free = logged_models.free_dims(signature, (1, 2), (1, 2))
    assert free.inputs.inputs[0].shape == (-1, -1, -1, 3) and free.outputs.inputs[0].shape == (-1, -1, -1)
    assert logged_models.free_dims(signature).inputs.inputs[0].shape == (-1, 32, 24, 3)   # none named: as inferred


def test_the_code_a_model_carries_is_its_workloads_package_alone_without_byte_code(tmp_path):
    top = logged_models._package_copy("workloads.forest", tmp_path)
    assert top == tmp_path / "workloads" and sorted(p.name for p in top.iterdir()) == ["__init__.py", "forest"]
    assert (top / "forest" / "predict.py").is_file() and not list(top.rglob("__pycache__"))


def test_a_table_of_whole_numbers_is_saved_as_the_signature_without_mlflows_missing_values_hint(tmp_path):
    """A model whose output is a table with integer columns (singa's retrieval model: query, rank,
    document, label) is saved without MLflow's hint that integers cannot hold missing values: the
    columns are the model's own, never missing, and the hint would sit in every such run's log."""
    import warnings

    import numpy as np
    import pandas as pd

    example = np.zeros((2, 8), np.float32)
    table = pd.DataFrame({"query": np.array([0, 1]), "rank": np.array([0, 0]), "distance": np.array([0.5, 0.7])})
    (tmp_path / "data").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logged_models.save_pyfunc(tmp_path / "model", {"orchard_workload": "singa"}, "workloads.singa.predict",
                                  tmp_path / "data", example, table, free_outputs=())
    assert not [str(w.message) for w in caught if "integer column" in str(w.message)]
    from mlflow.models import Model

    outputs = Model.load(str(tmp_path / "model")).signature.outputs
    assert [(c.name, c.type.name) for c in outputs.inputs] == [("query", "long"), ("rank", "long"), ("distance", "double")]
