"""workloads/video/checkpoint.py: video's own checkpoint and resume hook, without Ray: what ``python -m orchard resume`` relies on.

The end-to-end drill (a run interrupted, then resumed from its checkpoint alone, on two nodes with
S3 storage) is in tests/integration/test_cluster_storage.py.
"""
from __future__ import annotations

import io

import pytest

from orchard import ConfigError


def _state_bytes(seed: int) -> bytes:
    """A stream's ``replica.state_dict()`` as train.py hands it over: model and Adam state."""
    import torch

    from orchard.strategies.optimizers import torch_optimizer
    from workloads.video.model import build_stream_model

    torch.manual_seed(seed)
    model = build_stream_model(3, 4, [8, 16], 0.0)
    opt = torch_optimizer({"name": "adam", "lr": 0.01}, model.parameters())
    model(torch.rand(2, 3, 16, 16)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    return buf.getvalue()


def test_checkpoint_round_trips_through_storage_and_loads_weights_only(tmp_path):
    import torch

    from orchard.storage import Storage
    from workloads.video.checkpoint import (
        CHECKPOINT_NAME,
        load_checkpoint,
        save_checkpoint,
    )
    from workloads.video.model import load_model

    storage = Storage(tmp_path / "run")
    states = {"spatial": _state_bytes(0), "temporal": _state_bytes(1)}
    history = [{"epoch": 0, "workers": {"spatial": 1, "temporal": 2}, "val_loss": {"spatial": 1.2}}]
    save_checkpoint(storage, 0, states, {"spatial": 4, "temporal": 4}, {"spatial": 1, "temporal": 2}, history,
                    {"spatial": [0.1]})
    save_checkpoint(storage, 1, states, {"spatial": 8, "temporal": 8}, {"spatial": 1, "temporal": 2}, history,
                    {"spatial": [0.1, 0.2]}, training_done=True)   # a later epoch replaces it whole
    got = load_checkpoint(storage)
    assert got["epoch"] == 1 and got["training_done"] and got["steps"] == {"spatial": 8, "temporal": 8}
    assert got["alloc"] == {"spatial": 1, "temporal": 2} and got["history"] == history
    assert got["states"] == states and [p.name for p in storage.local_path.iterdir()] == [CHECKPOINT_NAME]
    # plain values only: the file loads with weights_only=True, and the states build the same models
    torch.load(storage.local_path / CHECKPOINT_NAME, weights_only=True)
    model = load_model(got["states"]["temporal"], 3, 4, [8, 16], 0.0)
    expected = torch.load(io.BytesIO(states["temporal"]), weights_only=True)["model"]
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_resume_points_the_config_at_a_checkpointed_run_and_refuses_one_without(compose, tmp_path):
    from orchard.storage import Storage
    from workloads import video
    from workloads.video.checkpoint import save_checkpoint

    cfg = compose("workload=video", "debug=smoke", f"output_dir={tmp_path}/out")
    gone = tmp_path / "out" / "video" / "interrupted-before-its-first-epoch"
    with pytest.raises(ConfigError) as err:
        video.resume(cfg, str(gone))
    assert err.value.key == "video.resume" and "\n" not in str(err.value)
    kept = tmp_path / "out" / "video" / "interrupted-after-epoch-0"
    save_checkpoint(Storage.for_run(cfg, kept), 0, {"spatial": b"", "temporal": b""}, {}, {}, [], {})
    video.resume(cfg, str(kept))
    assert cfg["video"]["resume"] == str(kept)
    predict = compose("workload=video", "mode=predict", f"output_dir={tmp_path}/out")
    with pytest.raises(ConfigError) as err:
        video.resume(predict, str(kept))
    assert err.value.key == "mode"


def test_a_resumed_feeder_deals_only_the_epochs_after_the_checkpoint(ray_session):
    import numpy as np

    from workloads.video.feeder import END, Feeder
    from workloads.video.queues import make_queues, shutdown_queues

    queues = make_queues({"spatial": 1}, 64)
    feeder = Feeder({"spatial": "rgb"}, queues, batch_size=2, epochs=4, first_epoch=2)
    rows = {"rgb": np.arange(8).reshape(8, 1), "label": np.zeros(8, int), "epoch": np.array([2] * 4 + [3] * 4)}
    feeder.run(iter([rows]))
    assert feeder.error is None
    q = queues["spatial"][0]
    items = [q.get(timeout=10) for _ in range(q.qsize())]
    shutdown_queues(queues)
    marks = [i for i in items if isinstance(i, tuple)]
    assert marks == [(END, 2), (END, 3)]   # no mark for the epochs the first run trained
    assert sum(len(i["y"]) for i in items if isinstance(i, dict)) == 8
