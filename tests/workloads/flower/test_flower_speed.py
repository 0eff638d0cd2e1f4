"""flower at GPU speed (issue 19), the parts a CPU can check: the loader, the step's precision
options, device-explicit prediction, the blob counter's cached calibration, and the settings
refused before Ray starts. CUDA cases are marked ``gpu`` (skipped without one)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from workloads.flower.density_map import density_map
from workloads.flower.loader import density_targets, TileLoader
from workloads.flower.model import FlowerCounterCNN


def random_tiles(n=24, size=32, seed=0):
    """Tiles (n, size, size, 3) uint8 and their flower points, as the tile cache holds them."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8)
    points = [rng.uniform(0, size, (int(rng.integers(0, 4)), 2)) for _ in range(n)]
    return images, points


def test_loader_batches_are_the_shard_tiles_and_their_targets_each_epoch():
    images, points = random_tiles()
    targets = density_targets(points, 32, 2.5).astype(np.float16)
    shard = np.array([3, 5, 7, 11, 13, 17, 19, 23, 2, 4])  # a worker's tiles, unsorted
    loader = TileLoader(images, targets, shard, batch_size=4, scale=100.0, depth=2, threads=2)
    order = np.random.default_rng(1).permutation(len(shard))
    batches = list(loader.epoch(order))
    assert len(batches) == 2  # 10 tiles, batch 4: the remainder is dropped
    for b, (x, target) in enumerate(batches):
        tiles = shard[order[4 * b:4 * b + 4]]
        assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and x.is_contiguous()
        np.testing.assert_allclose(x.permute(0, 2, 3, 1).numpy(), images[tiles] / 255.0, atol=1e-6)
        assert target.shape == (4, 1, 32, 32) and target.dtype == torch.float32
        for row, tile in enumerate(tiles):  # the targets sum to the counts, x scale (float16 storage)
            expected = density_map(points[tile], 32, 32, 2.5) * 100.0
            np.testing.assert_allclose(target[row, 0].numpy(), expected, atol=0.05)
            assert float(target[row].sum()) == pytest.approx(100.0 * len(points[tile]), abs=0.5)
    again = list(loader.epoch(order))  # buffers and threads are reusable epoch after epoch
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    # a loop that stops early (an interrupt, the last epoch) leaves the loader usable
    for _ in loader.epoch(order):
        break
    assert len(list(loader.epoch(order[:8]))) == 2


def test_loader_channels_last_batches_are_nhwc_in_memory():
    images, points = random_tiles(8)
    loader = TileLoader(images, density_targets(points, 32, 2.5), np.arange(8), 4, 1.0, channels_last=True)
    x, _ = next(iter(loader.epoch(np.arange(8))))
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_loader_micro_bench_runs():
    from workloads.flower.loader import loader_images_per_s

    # a sanity call at a tiny size: the figure itself is for the benchmark runner, never asserted
    assert loader_images_per_s(tile_size=32, batch_size=8, batches=3, tiles=32) > 0
    assert loader_images_per_s(tile_size=32, batch_size=8, batches=3, tiles=32, gather_only=True) > 0


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


def test_prediction_takes_the_device_explicitly_and_batches_tiles():
    from workloads.flower.evaluate import predict_density
    from workloads.flower.predict import count_image

    torch.manual_seed(0)
    model = FlowerCounterCNN().eval()
    images, _ = random_tiles(5)
    one_by_one, _ = predict_density(model, images, 100.0, batch_size=1, device="cpu")
    batched, _ = predict_density(model, images, 100.0, batch_size=4, device=torch.device("cpu"))
    assert batched.shape == (5, 32, 32) and (batched >= 0).all()
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-4, atol=1e-6)
    rgb = np.random.default_rng(3).integers(0, 255, (70, 45, 3), dtype=np.uint8)
    density = count_image(model, rgb, 32, 100.0, batch_size=2, device="cpu")
    assert density.shape == (70, 45)
    np.testing.assert_allclose(density, count_image(model, rgb, 32, 100.0), rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_prediction_on_cuda_counts_what_the_cpu_counts():
    from workloads.flower.evaluate import predict_density
    from workloads.flower.predict import count_image

    torch.manual_seed(0)
    model = FlowerCounterCNN().eval()
    images, _ = random_tiles(6, 64)
    on_cpu, _ = predict_density(model, images, 100.0, device="cpu")
    on_gpu, _ = predict_density(model, images, 100.0, batch_size=4, device="cuda")
    np.testing.assert_allclose(on_gpu.sum(axis=(1, 2)), on_cpu.sum(axis=(1, 2)), rtol=1e-3, atol=1e-3)
    rgb = np.random.default_rng(3).integers(0, 255, (150, 201, 3), dtype=np.uint8)
    assert float(count_image(model.cuda(), rgb, 64, 100.0).sum()) == pytest.approx(
        float(count_image(model.cpu(), rgb, 64, 100.0).sum()), rel=1e-3, abs=1e-3)


@pytest.mark.gpu
def test_loader_on_cuda_hands_the_same_batches_from_pinned_buffers():
    images, points = random_tiles(16)
    targets = density_targets(points, 32, 2.5).astype(np.float16)
    on_cpu = TileLoader(images, targets, np.arange(16), 4, 100.0, depth=2)
    on_gpu = TileLoader(images, targets, np.arange(16), 4, 100.0, device="cuda", depth=2, threads=2)
    order = np.random.default_rng(0).permutation(16)
    for _ in range(2):
        for (xc, yc), (xg, yg) in zip(on_cpu.epoch(order), on_gpu.epoch(order)):
            # the same tiles, scaled on the device: CUDA divides by a scalar as a multiply by its
            # reciprocal, the CPU divides, so x may differ in its last bit; the targets are exact
            assert xg.is_cuda and torch.equal(yg.cpu(), yc)
            torch.testing.assert_close(xg.cpu(), xc, rtol=2**-23, atol=0)


def test_the_blob_counter_is_calibrated_once_per_content_in_ray_tasks(ray_session, tmp_path):
    from orchard.storage import Storage
    from workloads.flower import baseline_counter
    from workloads.flower.synthetic_field import render_field

    rng = np.random.default_rng(0)
    tiles, counts = [], []
    for _ in range(6):
        rgb, points, _ = render_field(rng, 32, 32, (0, 0, 32, 32), 32, 2.0, (2.5, 4.0), 0.0, 0.0)
        tiles.append(rgb)
        counts.append(len(points))
    tiles, counts = np.stack(tiles), np.array(counts)
    grid = {"cutoffs": [0.7, 0.8], "thresholds": [0.01, 0.02], "gain": 20.0, "min_sigma": 1.5, "max_sigma": 4.0}
    store = Storage(tmp_path / "tiles-32" / "baseline")
    first, hit = baseline_counter.cached_calibration(store, tiles[:4], counts[:4], tiles[4:], grid, cpus=2)
    assert not hit
    # the grid search as one process would do it: the same choice, the same test counts
    serial = []
    for cutoff in grid["cutoffs"]:
        for threshold in grid["thresholds"]:
            params = {"cutoff": cutoff, "gain": 20.0, "threshold": threshold, "min_sigma": 1.5, "max_sigma": 4.0}
            serial.append((float(np.mean(np.abs(baseline_counter.predict_counts(tiles[:4], params)[0] - counts[:4]))),
                           params))
    best = min(serial, key=lambda m: m[0])  # min keeps the first of equals, like the grid order
    assert first["params"] == best[1] and first["calibration_mae"] == pytest.approx(best[0])
    assert first["test_counts"] == baseline_counter.predict_counts(tiles[4:], best[1])[0].tolist()
    again, hit = baseline_counter.cached_calibration(store, tiles[:4], counts[:4], tiles[4:], grid, cpus=2)
    assert hit and again == first
    # other tiles or another grid: calibrated anew
    assert not baseline_counter.cached_calibration(store, tiles[1:5], counts[1:5], tiles[4:], grid, cpus=2)[1]
    assert not baseline_counter.cached_calibration(store, tiles[:4], counts[:4], tiles[4:], {**grid, "gain": 10.0},
                                                   cpus=1)[1]


@pytest.mark.parametrize("overrides,key", [
    (["debug=smoke", "flower.tile_size=400"], "flower.tile_size"),          # larger than the field
    (["debug=smoke", "flower.tile_size=224"], "flower.batch_size"),         # 4 tiles: not a batch per worker
    (["strategy=ps", "flower.precision=fp16"], "flower.precision"),
    (["strategy.gpus_per_worker=0.5", "strategy.backend=nccl"], "strategy.backend"),
    (["flower.precision=fp8"], "flower.precision"),
    (["flower.log_every=0"], "flower.log_every"),
])
def test_settings_that_would_fail_late_are_refused_before_ray_starts(compose, overrides, key):
    from orchard import ConfigError
    from workloads import flower

    with pytest.raises(ConfigError) as err:
        flower.validate(compose("workload=flower", *overrides))
    assert err.value.key == key


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
    assert (s["name"], s["gpus_per_worker"], s["backend"]) == ("ring", 1, "nccl")


@pytest.mark.slow
def test_the_gpu_preset_falls_back_to_the_cpu_at_smoke_size(run_orchard):
    """experiment=flower_gpu with the CPU overrides its file names: tile 224, bf16, channels_last,
    loss read every 20 steps and at epoch ends, the time split and the caches recorded."""
    result = run_orchard("workload=flower", "experiment=flower_gpu", "debug=smoke", "strategy.gpus_per_worker=0",
                         "strategy.backend=gloo", "strategy.cpus_per_worker=1", "flower.synthetic.height=720",
                         "flower.synthetic.width=1280", "flower.bins=[[0,null]]", "flower.profile_every=0")
    assert result.exit_code == 0, result.run.data.tags.get("orchard.error") if result.run else result
    params, m = result.run.data.params, result.run.data.metrics
    assert (params["flower.tile_size"], params["flower.precision"], params["flower.channels_last"]) == ("224", "bf16", "True")
    assert m["throughput/mean_images_per_s"] > 0 and np.isfinite(m["test/mae"]) and np.isfinite(m["baseline/mae"])
    for key in ("time/prepare_s", "time/train_start_s", "time/steps_s", "time/evaluate_s"):
        assert key in m, key
    steps = int(params["flower.train_tiles"]) // 4  # one worker, the smoke batch of 4
    assert 1 < steps < 10  # so no window ends at step 20
    # per epoch: the warmup step alone (epoch 1), then one window to the epoch's end
    assert len(result.history("train/loss")) == 3
    assert result.run.data.tags["flower.baseline"] == "calibrated"


def test_a_profiled_steps_trace_is_logged_from_the_users_own_folder_and_not_kept(monkeypatch):
    """The profiled step's Chrome trace goes to the run (``traces/``) from this user's 0700
    folder, never a guessable /tmp path, and no copy stays on the node.  (The torch profiler
    itself, ~10 s to start here, writes real traces in the smoke runs: test_run.py.)"""
    import json
    import os
    import stat

    from orchard.storage.private_tmp import private_tmp
    from workloads.flower import train
    from workloads.flower.train import profiled_step

    def trace_of(run_step, path):
        run_step()
        path.write_text(json.dumps({"traceEvents": [{"name": "step"}]}))

    monkeypatch.setattr(train, "trace_step", trace_of)

    class Ctx:
        logged = []

        def log_artifact(self, path, folder):
            path = Path(path)
            mode = stat.S_IMODE(path.parent.parent.stat().st_mode)
            self.logged.append((path, folder, path.parent.parent, mode, json.loads(path.read_text())))

    steps = []
    profiled_step(lambda: steps.append(torch.ones(4).sum()), Ctx(), rank=1, step=20)
    (path, folder, parent, mode, trace), = Ctx.logged
    assert steps and folder == "traces" and path.name == "rank1_step20.json"
    assert parent == private_tmp() and mode == 0o700 and private_tmp().stat().st_uid == os.getuid()
    assert "traceEvents" in trace
    assert not path.parent.exists()   # sent, then removed


def test_cache_evicted_bytes_adds_the_drivers_and_each_workers_once():
    """``cache/evicted_bytes``: the driver's evictions and each Train worker's (from its summary);
    a worker in the driver's own process (local mode) is already in the driver's count."""
    import os

    from workloads.flower.throughput import cache_evicted

    workers = [{"rank": 0, "cache_evicted_bytes": 300, "pid": os.getpid() + 1},
               {"rank": 1, "cache_evicted_bytes": 40, "pid": os.getpid() + 2},
               {"rank": 2, "cache_evicted_bytes": 7, "pid": os.getpid()},
               {"rank": 3}]   # a summary from before the count existed (a resumed run's)
    assert cache_evicted(workers, 1000) == 1340.0
