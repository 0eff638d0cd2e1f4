"""The one finiteness check of every training loop (orchard/run/divergence.py), the ``Diverged`` line
it raises, and what the summary offers after it (no plain ``resume`` into the same divergence)."""
from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
import torch

from orchard.errors import Diverged
from orchard.run import divergence


def test_a_nan_loss_raises_one_line_naming_where_and_the_key_to_lower():
    with pytest.raises(Diverged) as caught:
        divergence.check({"loss": float("nan")}, epoch=3, step=12, key="singa.lr", value=1e30)
    assert str(caught.value) == "loss is NaN at epoch 3 step 12: lower singa.lr (now 1e+30)"
    assert (caught.value.step, caught.value.key) == (12, "singa.lr")
    with pytest.raises(Diverged, match=r"^temporal loss is inf at epoch 1 step 2: lower video.optimizer.lr "
                                       r"\(now 0.002\) or use flower.precision=fp32$"):
        divergence.check({"temporal loss": math.inf}, epoch=1, step=2, key="video.optimizer.lr", value=0.002,
                         hint="use flower.precision=fp32")
    divergence.check({"loss": 1e30, "accuracy": 0.5}, epoch=1, step=1, key="singa.lr")  # large is still finite


def test_weights_are_checked_as_numpy_arrays_and_torch_tensors():
    assert divergence.all_finite([np.ones(3), torch.zeros(2, 2)])
    assert not divergence.all_finite([np.ones(3), torch.tensor([1.0, float("inf")])])
    assert not divergence.all_finite({"w": np.array([np.nan])}.values())
    model = torch.nn.Linear(2, 2)
    divergence.check_weights(model.parameters(), epoch=1, step=4, key="flower.optimizer.lr", value=1.0)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(Diverged, match="^weights are NaN or inf at epoch 1 step 4: lower flower.optimizer.lr"):
        divergence.check_weights(model.parameters(), epoch=1, step=4, key="flower.optimizer.lr", value=1.0)


def test_diverged_crosses_processes_whole():
    """Ray pickles it between a worker and the driver; flower's workers hand it over as JSON."""
    err = Diverged("loss", "NaN", 2, 7, "flower.optimizer.lr", 1e30, checkpoint=True)
    for again in (pickle.loads(pickle.dumps(err)), Diverged(**json.loads(json.dumps(err.fields())))):
        assert str(again) == str(err) and again.fields() == err.fields()


def test_resume_of_a_diverged_run_needs_a_new_value_for_its_key():
    from orchard.run.divergence import resume_guard

    tags = {"orchard.diverged": "loss is NaN at epoch 1 step 3: lower singa.lr (now 1e+30)",
            "orchard.diverged_key": "singa.lr"}
    refused = resume_guard(tags, ["tracking.uri=sqlite:///x.db"])
    assert refused and "singa.lr" in refused and "resume <id> singa.lr=" in refused
    assert resume_guard(tags, ["singa.lr=0.01"]) is None
    assert resume_guard({}, []) is None  # a run that did not diverge
