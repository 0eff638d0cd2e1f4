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
