"""Parameter servers apply the same update rule as torch.optim (so ring and ps runs agree)."""

import numpy as np
import pytest
import torch

from orchard.strategies.optimizers import NumpyOptimizer, torch_optimizer


@pytest.mark.parametrize("spec", [
    {"name": "sgd", "lr": 0.1},
    {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
    {"name": "adagrad", "lr": 0.1},
    {"name": "adam", "lr": 0.01, "weight_decay": 1e-4},
])
def test_numpy_optimizer_matches_torch(spec):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(6)]
    w = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch_optimizer(spec, [w])
    ours = NumpyOptimizer(spec)
    params = {"w": w0.copy()}
    for g in grads:
        w.grad = torch.from_numpy(g.copy())
        opt.step()
        params = ours.apply(params, {"w": g})
    np.testing.assert_allclose(params["w"], w.detach().numpy(), rtol=1e-5, atol=1e-6)
