"""workloads/flower/loader.py: the tile loader: the shard's tiles and their density targets each epoch,
channels-last batches, pinned buffers on a GPU (marked gpu)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from workloads.flower.density_map import density_map
from workloads.flower.loader import density_targets, TileLoader

from .helpers import random_tiles


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
