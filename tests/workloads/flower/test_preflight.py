"""workloads/flower/preflight.py: settings that would fail late refused before Ray starts, and the GPU
preset that falls back to the CPU."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("overrides,key", [
    (["debug=smoke", "flower.tile_size=400"], "flower.tile_size"),          # larger than the field
    (["debug=smoke", "flower.tile_size=224"], "flower.batch_size"),         # 4 tiles: not a batch per worker
    (["strategy=ps", "flower.precision=fp16"], "flower.precision"),
    (["strategy.gpus_per_worker=0.5", "strategy.backend=nccl"], "strategy.backend"),
    (["flower.precision=fp8"], "flower.precision"),
    (["flower.log_every=0"], "flower.log_every"),
    (["flower.eval_device=cuda:99"], "flower.eval_device"),               # counted on the driver: no such GPU
    (["flower.eval_device=cudax"], "flower.eval_device"),
])
def test_settings_that_would_fail_late_are_refused_before_ray_starts(compose, overrides, key):
    from orchard import ConfigError
    from workloads import flower

    with pytest.raises(ConfigError) as err:
        flower.validate(compose("workload=flower", *overrides))
    assert err.value.key == key


def test_a_cuda_eval_device_the_driver_cannot_see_is_refused_before_training(compose):
    """The test set is counted in the driver's process once training ended: on a machine whose
    torch sees no GPU, ``flower.eval_device=cuda`` was a torch error after the whole training."""
    import torch

    from orchard import ConfigError
    from workloads import flower

    if torch.cuda.is_available():
        pytest.skip("this machine's torch sees a GPU: cuda is a device it has")
    with pytest.raises(ConfigError, match="sees no CUDA GPU") as err:
        flower.validate(compose("workload=flower", "flower.eval_device=cuda"))
    assert err.value.key == "flower.eval_device"
    flower.validate(compose("workload=flower", "flower.eval_device=cpu"))


def test_a_roi_smaller_than_a_tile_in_the_users_data_is_refused(compose, tmp_path):
    import cv2

    from orchard import ConfigError
    from workloads import flower

    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.png"), np.zeros((300, 400, 3), np.uint8))
    (tmp_path / "points.csv").write_text("image,x,y\na.png,10,10\n")
    ok = compose("workload=flower", f"flower.data_dir={tmp_path}", "flower.batch_size=2", "strategy.num_workers=1")
    flower.validate(ok)  # 24 tiles of 64 px: enough for one batch
    with pytest.raises(ConfigError) as err:
        flower.validate(compose("workload=flower", f"flower.data_dir={tmp_path}", "flower.roi=[0,0,50,300]"))
    assert err.value.key == "flower.roi"
    with pytest.raises(ConfigError) as err:
        flower.validate(compose("workload=flower", f"flower.data_dir={tmp_path}", "flower.tile_size=320"))
    assert err.value.key == "flower.tile_size"


def test_the_gpu_preset_composes_with_the_thesis_tile_bf16_and_a_gpu_per_worker(compose):
    from workloads import flower

    cfg = compose("workload=flower", "experiment=flower_gpu")
    flower.validate(cfg)
    f, s = cfg["flower"], cfg["strategy"]
    assert (f["tile_size"], f["precision"], f["channels_last"]) == (224, "bf16", True)
    assert f["batch_size"] >= 64 and f["log_every"] > 1
    # auto: NCCL for a whole GPU a worker (process_group.py), gloo where trials share one (a sweep)
    assert (s["name"], s["gpus_per_worker"], s["backend"]) == ("ring", 1, "auto")


@pytest.mark.parametrize("extra", [["strategy=ps"], ["sweep=flower_gpu", "strategy.gpus_per_worker=0.125",
                                                     "strategy.cpus_per_worker=1"]])
def test_the_gpu_preset_takes_ps_and_the_gpu_sweep_as_documented(compose, extra):
    """docs/flower.md's and docs/sweeps.md's GPU commands compose and validate: ps at one GPU, and
    the sweep whose trials share a GPU (there gloo, as NCCL wants a GPU per rank)."""
    from orchard.config import registry, validate

    cfg = compose("workload=flower", "experiment=flower_gpu", *extra)
    validate(cfg, registry.load("flower"))
    if "sweep=flower_gpu" in extra:
        assert cfg["sweep"]["name"] == "flower_gpu" and cfg["strategy"]["num_workers"] == 1
        assert cfg["flower"]["batch_size"] == 64  # the preset's, until the sweep's grid sets it per trial


@pytest.mark.slow
def test_the_gpu_preset_falls_back_to_the_cpu_at_smoke_size(run_orchard):
    """experiment=flower_gpu with the CPU overrides its file names: tile 224, bf16, channels_last,
    loss read every 20 steps and at epoch ends, the time split and the caches recorded."""
    result = run_orchard("workload=flower", "experiment=flower_gpu", "debug=smoke", "strategy.gpus_per_worker=0",
                         "strategy.backend=gloo", "strategy.cpus_per_worker=1", "flower.synthetic.height=560",
                         "flower.synthetic.width=784", "flower.bins=[[0,null]]", "flower.profile_every=0")
    assert result.exit_code == 0, result.run.data.tags.get("orchard.error") if result.run else result
    params, m = result.run.data.params, result.run.data.metrics
    assert (params["flower.tile_size"], params["flower.precision"], params["flower.channels_last"]) == ("224", "bf16", "True")
    assert m["throughput/mean_images_per_s"] > 0 and np.isfinite(m["test/mae"]) and np.isfinite(m["test/baseline_mae"])
    for key in ("time/prepare_s", "time/train_start_s", "time/steps_s", "time/evaluate_s"):
        assert key in m, key
    steps = int(params["flower.train_tiles"]) // 4  # one worker, the smoke batch of 4
    assert 1 < steps < 10  # so no window ends at step 20
    # per epoch: the warmup step alone (epoch 1), then one window to the epoch's end
    assert len(result.history("train/loss")) == 3
    assert result.run.data.tags["flower.baseline"] == "calibrated"
