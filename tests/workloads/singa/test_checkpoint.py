"""workloads/singa/checkpoint.py under divergence: the last finite one is kept (the end-to-end run with
singa.lr=1e30 is in tests/integration/test_divergence.py)."""
from __future__ import annotations

import numpy as np
import pytest

from orchard.errors import Diverged


def test_a_checkpoint_is_never_overwritten_by_non_finite_weights(tmp_path):
    """What ``fit`` hands the checkpointer (``checkpoint.finite``): finite weights are written, NaN ones
    raise ``Diverged`` and leave the previous checkpoint as it was."""
    from orchard.storage import Storage
    from workloads.singa.checkpoint import CHECKPOINT_NAME, Checkpointer, finite, load_checkpoint

    saver, lr = Checkpointer(Storage(tmp_path), every=1), {"key": "singa.lr", "value": 1e30}
    saver(1, 2, lambda: finite({"w": np.ones((2, 2), np.float32)}, 1, 10, lr))
    with pytest.raises(Diverged, match=r"^weights are NaN or inf at epoch 2 step 20: lower singa.lr \(now 1e\+30\)$"):
        saver(2, 2, lambda: finite({"w": np.full((2, 2), np.nan, np.float32)}, 2, 20, lr))
    kept = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert kept["epoch"] == 1 and np.array_equal(kept["params"]["w"], np.ones((2, 2), np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]  # no partial file left beside it


def test_features_t_sne_cannot_embed_are_named_not_embedded():
    """A net collapsed by a too-high lr (singa.lr=6 on mlp) gives every image the same features:
    scikit-learn's t-SNE would end the process with a segmentation fault, NaN would raise."""
    from workloads.singa.figures import tsne_problem

    rng = np.random.default_rng(0)
    assert tsne_problem(rng.normal(size=(60, 8)).astype(np.float32)) is None
    assert tsne_problem(np.zeros((60, 8), np.float32)).startswith("are the same for every image")
    assert tsne_problem(np.full((60, 2, 4), 3.0, np.float32)).startswith("are the same for every image")
    assert tsne_problem(np.where(np.eye(60, 8) > 0, np.nan, 1.0)) == "are not all finite"


@pytest.mark.slow
def test_a_run_that_diverges_after_a_checkpoint_keeps_it_and_offers_resume_with_a_lower_lr(run_orchard, capsys):
    """singa.lr=1e5 trains epoch 1 to finite weights (checkpointed) and diverges in epoch 2."""
    from pathlib import Path

    from workloads.singa.checkpoint import CHECKPOINT_NAME, load_checkpoint

    result = run_orchard("workload=singa", "singa.arch=local", "debug=smoke", "singa.epochs=4", "singa.lr=1e5")
    console = "".join(capsys.readouterr())
    assert result.exit_code == 1 and result.run.info.status == "FAILED"
    assert "at epoch 2 step" in result.run.data.tags["orchard.diverged"], result.run.data.tags["orchard.diverged"]
    kept = load_checkpoint(Path(result.run.data.tags["orchard.run_dir"]) / CHECKPOINT_NAME)
    assert kept["epoch"] == 1 and all(np.isfinite(v).all() for v in kept["params"].values())
    assert f"resume:    with a lower singa.lr: python -m orchard resume {result.run.info.run_id} singa.lr=..." in console
