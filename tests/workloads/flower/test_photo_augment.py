"""Photos as cameras write them (issue 52): the training tiles pass through a camera's
degradations (photo_augment.py) in the loader, reproducibly, and the density targets never change.
That a model trained with them counts a field saved as JPEG as it counts the field's PNG is
measured by ``python -m bench flower_jpeg`` (bench/flower_jpeg.py: minutes of training per seed,
beside the same training without them; its smoke size is tests/bench/test_flower_jpeg.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from workloads.flower.loader import density_targets, TileLoader
from workloads.flower.photo_augment import batch_rng, PhotoDegradation
from workloads.flower.synthetic_field import render_field


def field_tiles(n=16, size=32):
    """Tiles of a rendered field (canopy, yellow flowers), not noise: what the loader holds."""
    rgb, points, _ = render_field(np.random.default_rng(3), 4 * size, 4 * size, (0, 0, 4 * size, 4 * size), size,
                                  3.0, (2.5, 5.0), 0.2, 0.0)
    tiles = rgb.reshape(4, size, 4, size, 3).swapaxes(1, 2).reshape(-1, size, size, 3)
    local = [points[(points[:, 0] // size == c) & (points[:, 1] // size == r)] - (c * size, r * size)
             for r in range(4) for c in range(4)]
    return np.ascontiguousarray(tiles[:n]), local[:n]


@pytest.fixture
def shipped(compose):
    """The degradations conf/workload/flower.yaml ships, on by default."""
    return PhotoDegradation.from_config(compose("workload=flower")["flower"]["augment"])


# every degradation on every tile (the shipped ones leave some tiles lossless, and some off)
EVERY = PhotoDegradation(jpeg_probability=1.0, jpeg_quality=(60, 95), blur_probability=0.5, blur_sigma=(0.3, 1.0),
                         noise_probability=0.5, noise_std=(1.0, 4.0), brightness=0.15, contrast=0.1, colour=0.05)


@pytest.mark.parametrize("which", ["shipped", "every"])
def test_a_batch_is_degraded_the_same_way_for_the_same_seed_and_otherwise_differently(shipped, which):
    degrade = shipped if which == "shipped" else EVERY
    tiles, _ = field_tiles()
    first = degrade(tiles.copy(), batch_rng((0, 1, 0), 2))
    assert first.dtype == np.uint8 and first.shape == tiles.shape
    assert np.abs(first.astype(int) - tiles).mean() > 1.0   # applied: not the rendered tiles
    np.testing.assert_array_equal(degrade(tiles.copy(), batch_rng((0, 1, 0), 2)), first)
    for key, batch in (((0, 1, 0), 3), ((0, 2, 0), 2), ((0, 1, 1), 2), ((1, 1, 0), 2)):  # batch, epoch, rank, seed
        assert not np.array_equal(degrade(tiles.copy(), batch_rng(key, batch)), first), (key, batch)


def test_the_jpeg_degradation_is_the_jpeg_pil_writes_at_the_drawn_quality():
    import io

    from PIL import Image

    tiles, _ = field_tiles(4)
    only_jpeg = PhotoDegradation(jpeg_probability=1.0, jpeg_quality=(80, 80), blur_probability=0.0,
                                 blur_sigma=(0.0, 0.0), noise_probability=0.0, noise_std=(0.0, 0.0),
                                 brightness=0.0, contrast=0.0, colour=0.0)
    got = only_jpeg(tiles.copy(), np.random.default_rng(0))
    for tile, degraded in zip(tiles, got):
        written = io.BytesIO()   # the file a camera or PIL writes (4:2:0), read back
        Image.fromarray(tile).save(written, "JPEG", quality=80)
        np.testing.assert_array_equal(degraded, np.asarray(Image.open(written).convert("RGB")))
        assert not np.array_equal(degraded, tile)
    # 4:2:0 halves the colour resolution: the yellow of a petal a few pixels across bleeds out,
    # which is what made a lossless-trained model undercount JPEG photos
    yellowness = lambda rgb: (rgb[..., :2].astype(float).mean(-1) - rgb[..., 2]).max()  # noqa: E731
    assert np.mean([yellowness(d) for d in got]) < np.mean([yellowness(t) for t in tiles])


def test_the_loader_degrades_images_reproducibly_and_never_the_density_targets():
    tiles, points = field_tiles()
    targets = density_targets(points, 32, 2.5).astype(np.float16)
    shard = np.array([3, 5, 7, 11, 13, 2, 4, 9])
    held = tiles.copy()
    order = np.random.default_rng(1).permutation(len(shard))
    plain = list(TileLoader(tiles, targets, shard, 4, 100.0, depth=2).epoch(order, (0, 0, 0)))
    one_thread = TileLoader(tiles, targets, shard, 4, 100.0, depth=2, threads=1, augment=EVERY)
    three_threads = TileLoader(tiles, targets, shard, 4, 100.0, depth=3, threads=3, augment=EVERY)
    degraded = list(one_thread.epoch(order, (0, 0, 0)))
    assert len(degraded) == len(plain) == 2
    for (x, y), (x3, y3), (x0, y0) in zip(degraded, three_threads.epoch(order, (0, 0, 0)), plain):
        assert torch.equal(x, x3) and torch.equal(y, y3)   # whichever thread made which batch
        assert torch.equal(y, y0)                          # the targets: the counts stay the truth
        assert (x - x0).abs().mean() > 1 / 255            # the images: degraded
    # the shard in RAM is never degraded: the next epoch starts from the rendered tiles again
    np.testing.assert_array_equal(one_thread.images.numpy(), held[shard])
    np.testing.assert_array_equal(tiles, held)
    again = list(one_thread.epoch(order, (0, 0, 0)))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(degraded, again))   # same key, same batches
    other_epoch = list(one_thread.epoch(order, (0, 1, 0)))
    assert not torch.equal(other_epoch[0][0], degraded[0][0])


def test_augment_null_trains_on_the_lossless_tiles_and_a_bad_value_is_one_line(compose, tmp_path):
    from orchard import ConfigError
    from orchard.api import Storage

    import workloads.flower as flower
    from workloads.flower.train import loop_config

    assert PhotoDegradation.from_config(compose("workload=flower", "flower.augment=null")["flower"]["augment"]) is None
    cfg = compose("workload=flower")
    assert cfg["flower"]["augment"]["jpeg_probability"] > 0   # on by default: cameras write JPEG
    # what every Ray Train worker reads (train.loop_config)
    worker_config = loop_config(cfg, Storage(str(tmp_path)), None, np.arange(4), np.arange(0))
    assert worker_config["augment"] == cfg["flower"]["augment"]
    for override, line in (("flower.augment.jpeg_quality=[95,75]", "[low, high] JPEG qualities, 1 <= low <= high"),
                           ("flower.augment.jpeg_quality=[0,90]", "got [0, 90]"),
                           ("flower.augment.jpeg_probability=1.5", "a probability in [0, 1], got 1.5"),
                           ("flower.augment.blur_sigma=[1]", "[low, high] blur sigma in pixels")):
        with pytest.raises(ConfigError) as err:
            flower.validate(compose("workload=flower", override))
        assert err.value.key == override.split("=")[0] and line in str(err.value) and "\n" not in str(err.value)



@pytest.mark.gpu
def test_a_cuda_loader_degrades_its_pinned_batches_as_the_cpu_loader_does():
    tiles, points = field_tiles()
    targets = density_targets(points, 32, 2.5).astype(np.float16)
    on_cpu = TileLoader(tiles, targets, np.arange(16), 4, 100.0, depth=2, augment=EVERY)
    on_gpu = TileLoader(tiles, targets, np.arange(16), 4, 100.0, device="cuda", depth=2, threads=2, augment=EVERY)
    order = np.random.default_rng(0).permutation(16)
    for epoch in range(2):   # the pinned buffers are reused: each batch degraded once, from the shard
        for (xc, yc), (xg, yg) in zip(on_cpu.epoch(order, (0, epoch, 0)), on_gpu.epoch(order, (0, epoch, 0))):
            assert xg.is_cuda and torch.equal(yg.cpu(), yc)
            torch.testing.assert_close(xg.cpu(), xc, rtol=2**-23, atol=0)
