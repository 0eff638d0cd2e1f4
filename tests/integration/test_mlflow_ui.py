"""The MLflow UI opens on what orchard recorded (issue 36), read back from the session's shared
CLI smoke runs (no run of its own): the experiment is tagged as model training, the run's model
is its output and its data its dataset input, the run says what it is and its headline result
(``mlflow.note.content``, ``headline/<name>``), its charts hold no bookkeeping and its page lists
the workload's params and tags first, the summary ends with the run's page in the UI,
and the model travels (pinned requirements, the workload's code inside, no orchard).  Where
Chromium is installed, a real headless browser opens the UI and checks the pages themselves
(the same code as ``scripts/mlflow_ui_screenshots.py``, which makes docs/images)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from orchard.tracking import bookkeeping, mlflow_run
from tests.integration.test_console import HEADLINE, SMOKE

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HEADLINE_METRIC = {"flower": ("headline/count_mae", "test/mae"),
                   "forest": ("headline/mean_class_accuracy", "test/mean_class_accuracy"),
                   "video": ("headline/fused_top1", None), "singa": ("headline/test_accuracy", "test/accuracy")}
# MLflow's own tags, set through its API (create_run, the tag constants it documents)
MLFLOW_TAGS = {"mlflow.runName", "mlflow.source.git.commit", "mlflow.source.name", "mlflow.note.content",
               "mlflow.parentRunId", "mlflow.user"}


@pytest.mark.parametrize("workload", list(SMOKE))
def test_a_smoke_run_opens_in_the_ui_with_its_model_data_description_and_headline(cli_run, workload):
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    run = cli_run(*SMOKE[workload])
    assert run.exit_code == 0, run.console[-3000:]
    info, tags, metrics = run.run.info, run.run.data.tags, run.run.data.metrics
    # the UI opens the experiment on its runs ("Model training"), not on GenAI traces
    assert run.client.get_experiment(info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    # the model is the run's output: a READY LoggedModel named model, from this run
    (output,) = run.run.outputs.model_outputs
    model = run.client.get_logged_model(output.model_id)
    assert model.name == "model" and model.source_run_id == info.run_id and str(model.status).endswith("READY")
    assert tags["orchard.logged_model"] == f"models:/{model.model_id}"
    # the data is its input, with a name that says which, a digest and where it came from
    (data,) = run.run.inputs.dataset_inputs
    assert data.dataset.digest and data.dataset.source and data.dataset.name
    assert {t.key: t.value for t in data.tags}[MLFLOW_DATASET_CONTEXT] == "training"
    if workload != "singa":   # singa's data ships in a package: its name is the dataset's (digits)
        assert "synthetic" in data.dataset.name and data.dataset.source_type == "code"
    # one line that says what the run is and how it did; the headline figure under one name
    note = tags["mlflow.note.content"]
    assert note.startswith(f"**{workload}**") and "debug=smoke" in note and "tracking.uri" not in note
    assert " → " in note and HEADLINE[workload] in note.split(" → ", 1)[1]   # the summary's headline line
    assert model.tags["mlflow.note.content"] == note   # the model's page says the same
    name, source = HEADLINE_METRIC[workload]
    assert name in metrics
    if source:
        assert metrics[name] == pytest.approx(metrics[source])
    # the charts open on what a user compares: no bookkeeping series among them (cache hits,
    # workers, data sizes, node losses where none happened), which the run keeps in
    # tables/bookkeeping.json; events that happened are charts (video's smoke data has bad files)
    assert not [k for k in metrics if bookkeeping.is_bookkeeping(k) and not bookkeeping.is_event(k)]
    sections = bookkeeping.chart_sections(metrics)
    assert bookkeeping.opening_section(sections) == "headline", sections
    assert bookkeeping.read(run.client, info.run_id)
    # the run page lists params and tags as the store recorded them: the workload's own first
    params, shown = list(run.run.data.params), [k for k in tags if not k.startswith("mlflow.")]
    assert params[0].startswith(f"{workload}.") and shown[:3] == ["orchard.workload", "orchard.strategy", "orchard.command"]
    assert [k in mlflow_run.OPERATIONAL_TAGS for k in shown] == sorted(k in mlflow_run.OPERATIONAL_TAGS for k in shown)
    # nothing of orchard's written into MLflow's own namespace
    assert {k for k in tags if k.startswith("mlflow.")} <= MLFLOW_TAGS
    # the summary ends with how to open the UI and the run's page in it (stderr follows stdout here)
    lines = run.console.splitlines()
    at = max(i for i, line in enumerate(lines) if line.startswith("view:      "))
    last = lines[at:at + 2]
    assert not any(line.startswith(("run dir:", "MLflow:", "figures:", "resume:")) for line in lines[at:])
    assert last[0].startswith(f"view:      python -m orchard ui {info.run_id[:8]} tracking.uri=")
    assert re.search(rf"\(opens http://127\.0\.0\.1:5000/#/experiments/{info.experiment_id}/runs/{info.run_id}"
                     r"\?workflowType=machine_learning\)$", last[1]), last


@pytest.mark.parametrize("workload", list(SMOKE))
def test_the_logged_model_pins_what_its_loader_imports_and_carries_its_code(cli_run, workload):
    """requirements.txt pins every line, never orchard (on no index); a pyfunc model carries its
    workload's package in code/ (tests/integration/test_model_travels.py loads one without orchard)."""
    run = cli_run(*SMOKE[workload])
    model_dir = run.run_dir / "model"
    pins = (model_dir / "requirements.txt").read_text().split()
    assert pins and all("==" in p for p in pins) and not any(p.split("==")[0] == "orchard" for p in pins), pins
    if workload == "forest":
        assert any(p.startswith("numba==") for p in pins)
    if workload != "flower":   # flower is MLflow's PyTorch flavour: torch.export needs no code of ours
        assert (model_dir / "code" / "workloads" / workload / "predict.py").is_file()
        assert not (model_dir / "code" / "orchard").exists()


def test_the_ui_in_a_headless_browser_lands_on_the_runs_and_the_run_page_lists_model_and_dataset(cli_run):
    """The real thing, where Chromium is installed (not in CI: .ci/run installs only from pip)."""
    script = _screenshots_script()
    chromium = script.find_chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium); CI checks the same through the API above")
    run = cli_run(*SMOKE["flower"])
    assert script.visit(run.uri, run.run_id, chromium) == []


def _screenshots_script():
    spec = importlib.util.spec_from_file_location("mlflow_ui_screenshots", ROOT / "scripts" / "mlflow_ui_screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
