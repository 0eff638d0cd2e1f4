"""The comparison notebooks (notebooks/<workload>_<what>.ipynb) execute against the shared CLI
smoke runs' MLflow store (tests/conftest.py ``cli_run``) and draw their plots."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = [("workload=forest",), ("workload=video",), ("workload=singa", "singa.arch=local")]
# notebook -> text its outputs must show (what the comparison is about, from these runs)
NOTEBOOKS = {
    "forest_partitions.ipynb": ["depth 5 x2, parts 2/2/2", "pixel acc"],
    "video_fusion.ipynb": ["attention", "spatial only", "untrimmed top-1"],
    "singa_architectures.ipynb": ["mlp / local", "images/s"],
}
# executed beside runs of their own: flower's compares strategies, and the flower module's smoke
# runs (ring, ps-sync, ps-async) are those runs: tests/workloads/flower/test_run.py
EXECUTED_ELSEWHERE = {"flower_strategies.ipynb"}


def test_every_workload_has_a_notebook_committed_without_outputs():
    import nbformat

    found = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert {*NOTEBOOKS, *EXECUTED_ELSEWHERE} <= found
    for name in [*NOTEBOOKS, *EXECUTED_ELSEWHERE]:
        nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"commit {name} without outputs"


@pytest.fixture(scope="module")
def store(cli_run):
    """The tracking URI of the store holding the smoke runs the notebooks read."""
    runs = [cli_run(*overrides) for overrides in RUNS]
    return runs[0].uri


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_notebook_compares_the_smoke_runs(store, name, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    # a failing cell raises CellExecutionError, naming the cell and the error
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    for expected in NOTEBOOKS[name]:
        assert expected in text, f"{name}: {expected!r} not in its outputs"
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2, f"{name} drew fewer than two plots"
