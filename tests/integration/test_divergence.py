"""Training that diverges stops clean (issue 31), in each workload that trains with a learning rate:
its lr at 1e30 with debug=smoke ends the run FAILED, exit 1, with one line naming the step and the
key to lower, ``train/diverged_at_step``, no model (no READY LoggedModel, no model artifact, no
figures), no checkpoint of non-finite weights, and a summary that offers to go on only with a new
value for the key.  forest has no learning rate and its gain cannot go NaN (docs/runs.md)."""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

CASES = {  # workload: (its overrides, its learning-rate key)
    "singa": (["workload=singa", "singa.arch=local"], "singa.lr"),
    "flower": (["workload=flower", "flower.epochs=1"], "flower.optimizer.lr"),
    "video": (["workload=video"], "video.optimizer.lr"),
}


def _arrays(value):
    """Every numeric array in a checkpoint's contents (nested dicts, lists, torch.save'd bytes)."""
    import torch

    if isinstance(value, dict):
        for v in value.values():
            yield from _arrays(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _arrays(v)
    elif isinstance(value, bytes):
        yield from _arrays(torch.load(io.BytesIO(value), weights_only=True))
    elif isinstance(value, torch.Tensor) and value.is_floating_point():
        yield value.numpy()
    elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
        yield value


def checkpoints(run_dir: Path) -> dict[str, list[np.ndarray]]:
    """The run's checkpoint files (singa's npz, video's file, Ray Train's state.pt) and their arrays."""
    import torch

    found = {}
    for path in [*run_dir.rglob("*_checkpoint.npz"), *run_dir.rglob("*_checkpoint.pt"), *run_dir.rglob("state.pt")]:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                found[str(path)] = [np.array(data[k]) for k in data.files if k.startswith("p:")]
        else:
            found[str(path)] = list(_arrays(torch.load(path, weights_only=True)))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("workload", list(CASES))
def test_a_diverging_run_stops_failed_keeps_finite_checkpoints_and_logs_no_model(run_orchard, capsys, workload):
    import mlflow

    overrides, key = CASES[workload]
    result = run_orchard(*overrides, "debug=smoke", f"{key}=1e30")
    console = "".join(capsys.readouterr())
    run = result.run
    assert result.exit_code == 1 and run.info.status == "FAILED", run.data.tags.get("orchard.error")
    step = run.data.metrics["train/diverged_at_step"]
    line = re.search(rf"^orchard: {workload} diverged: .+ (is|are) (NaN|inf|-inf|NaN or inf) at epoch \d+ step (\d+): "
                     rf"lower {re.escape(key)} \(now 1e\+30\)", console, re.M)
    assert line and int(line.group(3)) == step >= 1, console[-2000:]
    # the summary: no plain resume into the same divergence, a new value for the key instead
    assert not re.search(r"^resume: +python -m orchard resume", console, re.M), console[-1500:]
    assert re.search(rf"^(resume|again): +with a lower {re.escape(key)}\b.*: python -m orchard .*{re.escape(key)}=\.\.\.",
                     console, re.M), console[-1500:]
    # nothing was made of the non-finite weights: no model, no figures, no non-finite checkpoint
    mlflow.set_tracking_uri(result.client.tracking_uri)
    models = [m for m in mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
              if m.source_run_id == run.info.run_id]
    assert not [m for m in models if str(m.status).endswith("READY")]
    assert not result.artifacts("model") and not result.artifacts("figures")
    run_dir = Path(run.data.tags["orchard.run_dir"])
    assert not (run_dir / "model.pt").exists()
    for path, arrays in checkpoints(run_dir).items():
        assert arrays and all(np.isfinite(a).all() for a in arrays), path


@pytest.mark.slow
def test_a_sweep_with_a_diverging_trial_ranks_the_sane_one_best_and_registers_only_it(ray_session, tracking_uri,
                                                                                       tracking_dir, tmp_path, capsys):
    """singa's sweep, two trials one at a time: ``singa.lr`` 1e30 (diverges in its first epoch) and 0.1.
    The sane trial is best (``best_run_id``, ``best/<metric>``, ``best.*``), the diverged one is
    FAILED (or ranked last with a non-finite metric) and never named best, and ``sweep.register``
    puts only the sane trial's model in the registry (orchard/sweep/leaderboard.py, ``rank_key``)."""
    import math
    import uuid

    from mlflow.tracking import MlflowClient

    from orchard.run.lifecycle import execute, preflight, prepare

    name = f"singa-diverging-sweep-{uuid.uuid4().hex[:8]}"
    cfg, module = prepare(["workload=singa", "sweep=singa_mlp", "singa.arch=local", "debug=smoke",
                           "singa.tsne=false", f"sweep.register={name}", f"tracking.uri={tracking_uri}",
                           f"tracking.artifact_location={tracking_dir}/artifacts", f"output_dir={tmp_path}/out"])
    s = cfg["sweep"]
    metric = s["metric"]
    # the diverging value first: the sane trial then runs alone, so nothing but the rank decides;
    # fifo: ASHA has no second trial at a rung to compare with anyway
    s.update(num_samples=1, max_concurrent_trials=1, scheduler="fifo",
             params={"singa.lr": {"type": "grid", "values": [1e30, 0.1]}})
    preflight(cfg)
    outcome = execute(cfg, module)
    out, err = capsys.readouterr()
    assert outcome.exit_code == 0, (outcome.error, err[-3000:])

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    parent = client.get_run(outcome.run_id)
    assert parent.info.status == "FINISHED", parent.data.tags.get("orchard.error")
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{outcome.run_id}'")
    by_lr = {float(c.data.params["singa.lr"]): c for c in children}
    assert sorted(by_lr) == [0.1, 1e30], [c.data.params.get("singa.lr") for c in children]
    sane, diverged = by_lr[0.1], by_lr[1e30]

    # the sane trial is best, by id, metric and swept value
    assert sane.info.status == "FINISHED" and math.isfinite(sane.data.metrics[metric])
    assert parent.data.tags["best_run_id"] == sane.info.run_id
    assert parent.data.metrics[f"best/{metric}"] == pytest.approx(sane.data.metrics[metric])
    assert float(parent.data.tags["best.singa.lr"]) == 0.1
    # the diverged trial: failed (or a non-finite metric), and best in nothing
    assert diverged.info.status == "FAILED" or not math.isfinite(diverged.data.metrics.get(metric, math.nan))
    assert "train/diverged_at_step" in diverged.data.metrics, diverged.data.tags.get("orchard.error")
    assert not [k for k in diverged.data.tags if k.startswith("best")]
    assert diverged.info.run_id not in {v for k, v in parent.data.tags.items() if k.startswith("best")}

    # the leaderboard the user reads: the sane trial first, the diverged one never above it
    ranked = [line.split()[1] for line in out.splitlines() if re.match(r"^\d+\s+\S+\s+\S+\s+[0-9a-f]{12}\s*$", line)]
    assert ranked and ranked[0] == "0.1", out[-2000:]

    # only the sane trial's model is in the registry
    versions = client.search_model_versions(f"name = '{name}'")
    assert [v.run_id for v in versions] == [sane.info.run_id]
    assert parent.data.tags["orchard.registered_model"] == f"models:/{name}/{versions[0].version}"
