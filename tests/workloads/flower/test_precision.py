"""workloads/flower/precision.py: flower.precision, flower.channels_last and flower.compile: every precision
trains on the CPU, the compiled step is the plain one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from workloads.flower.loader import density_targets, TileLoader
from workloads.flower.model import FlowerCounterCNN

from .helpers import random_tiles


@pytest.mark.slow
@pytest.mark.parametrize("precision,channels_last", [("fp32", False), ("bf16", False), ("fp16", False),
                                                     ("bf16", True)])
def test_every_precision_trains_on_the_cpu(precision, channels_last):
    from orchard.strategies import worker
    from workloads.flower.precision import Precision, prepare_model
    from workloads.flower.train import train_step

    images, points = random_tiles(8)
    loader = TileLoader(images, density_targets(points, 32, 2.5), np.arange(8), 4, 100.0,
                        channels_last=channels_last)
    torch.manual_seed(0)
    model = prepare_model(FlowerCounterCNN(), channels_last)
    before = [p.detach().clone() for p in model.parameters()]
    replica = worker.replica(model, {"name": "adam", "lr": 1e-3}, {"strategy": {"name": "ring"}})
    step = Precision(precision, torch.device("cpu"))
    sums = torch.zeros(2)
    for _ in range(6):  # fp16: the GradScaler skips the first steps while its scale comes down from 2**16
        for x, target in loader.epoch(np.arange(8)):
            train_step(replica.model, replica, step, x, target, sums)
    assert torch.isfinite(sums).all() and float(sums[0]) > 0
    moved = sum(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert moved >= len(before) // 2, "the optimizer did not update the model"
    if precision == "fp16":
        assert step.state_dict()["scaler"]["scale"] > 0  # the GradScaler ran and is checkpointable


@pytest.mark.slow
def test_compiled_step_matches_the_plain_one():
    from orchard.strategies import worker
    from workloads.flower.precision import Precision, compiled
    from workloads.flower.train import train_step

    images, points = random_tiles(4, 16)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    target = torch.from_numpy(density_targets(points, 16, 2.0)).unsqueeze(1)
    losses = []
    for compile_it in (False, True):
        torch.manual_seed(0)
        model = FlowerCounterCNN()
        replica = worker.replica(model, {"name": "sgd", "lr": 1e-3}, {"strategy": {"name": "ring"}})
        sums = torch.zeros(2)
        train_step(compiled(replica.model, compile_it), replica, Precision("fp32", torch.device("cpu")), x, target, sums)
        losses.append(float(sums[0]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
