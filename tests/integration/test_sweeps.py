"""Every shipped sweep (conf/sweep/) runs to the end on its real workload at ``debug=smoke``:
the trial's placement group and the concurrency come from the workload's ``resources(cfg)``, the
parent and its child finish, nothing is left RUNNING.  One trial each (the first value of every
grid or choice) keeps the four under a few minutes on 2 cores."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchard.run.lifecycle import execute, preflight, prepare

pytestmark = pytest.mark.slow
SWEEPS = {"singa_mlp": "singa", "forest_features": "forest", "flower_lr": "flower", "video_lr": "video"}
# shipped sweeps whose whole run, with these checks, is another test's already
RUN_ELSEWHERE = {"flower_lr": "tests/integration/test_many_runs.py: all 4 trials, beside other runs"}
# shipped sweeps whose trials need a CUDA GPU (a worker that sees none ends the run before it starts):
# here their commands compose and validate; the sweep of trials sharing a GPU runs on the tiny workload
GPU_ONLY = {"flower_gpu": "tests/workloads/flower/test_preflight.py; tests/orchard/sweep/test_sweep.py (GPU shares)"}


def test_every_shipped_sweep_is_tested():
    shipped = {p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "sweep").glob("*.yaml")}
    assert shipped == set(SWEEPS) | set(GPU_ONLY)
    assert {"flower", "forest", "singa", "video"} == set(SWEEPS.values())
    assert set(RUN_ELSEWHERE) < set(SWEEPS)


@pytest.mark.parametrize("sweep", [s for s in SWEEPS if s not in RUN_ELSEWHERE])
def test_shipped_sweep_runs_to_the_end_at_smoke(sweep, ray_session, tracking_uri, tracking_dir, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    cfg, module = prepare([f"workload={SWEEPS[sweep]}", f"sweep={sweep}", "debug=smoke",
                           f"tracking.uri={tracking_uri}", f"tracking.artifact_location={tracking_dir}/artifacts",
                           f"output_dir={tmp_path}/out"])
    s = cfg["sweep"]
    s["num_samples"] = 1
    for spec in s["params"].values():
        if spec["type"] in ("grid", "choice"):
            spec["values"] = spec["values"][:1]
    preflight(cfg)
    outcome = execute(cfg, module)
    captured = capsys.readouterr()
    out = captured.out
    assert outcome.exit_code == 0, outcome.error
    assert "trial(s) at once; each holds" in out and "rank" in out
    client = MlflowClient(tracking_uri)
    parent = client.get_run(outcome.run_id)
    assert parent.info.status == "FINISHED"
    assert f"best/{s['metric']}" in parent.data.metrics
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{outcome.run_id}'")
    assert [c.info.status for c in children] == ["FINISHED"]
    assert s["metric"] in children[0].data.metrics
    assert parent.data.tags["best_run_id"] == children[0].info.run_id
    # the trial trains on the sweep's data (one dataset), says what it was given, and has its headline
    for r in (parent, children[0]):
        assert r.inputs.dataset_inputs, (r.info.run_name, [ln for ln in (out + captured.err).splitlines()
                                                          if "dataset" in ln or "Error" in ln][-20:])
    digests = {r.inputs.dataset_inputs[0].dataset.digest for r in (parent, children[0])}
    assert len(digests) == 1
    assert " · trial " in children[0].data.tags["mlflow.note.content"]
    assert any(k.startswith("headline/") for k in children[0].data.metrics)
