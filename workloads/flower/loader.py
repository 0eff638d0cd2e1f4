"""The training input pipeline: batches of tiles and their density targets, ready on the device.

What the step needs per batch is two gathers from memory, so that is all the loader does:
- the density targets are made once per tile cache and sigma (``density_targets``, kept in
  storage beside the tiles), never per step;
- each worker holds its shard of tiles and targets in RAM, and a batch is an ``index_select``
  of the shuffled order (on CUDA into reused pinned buffers, so the copy is asynchronous);
- images travel as uint8 and targets as float16 (a quarter and a half of float32's bytes) and
  become float32 on the device; NHWC permuted to NCHW is already the channels_last layout;
- ``threads`` loader threads make batches ahead of the step (``depth`` batches in flight); on
  the CPU they also do the float conversion, off the step's thread;
- with ``augment`` (``photo_augment.PhotoDegradation``) the loader threads degrade each batch's
  uint8 tiles as a camera would (JPEG, blur, noise, exposure) after the gather, from a generator
  of the batch's own (``photo_augment.batch_rng``); the targets are never touched.

Measured with ``python -m workloads.flower.loader`` (images/s on one thread; no test asserts it).
"""
from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .density_map import density_map
from .photo_augment import batch_rng

DENSITY_FILE = "density.npy"


def density_targets(points: list[np.ndarray], size: int, sigma: float) -> np.ndarray:
    """Density maps (N, size, size) float32 for every tile's points (N arrays of (k, 2) x,y),
    each summing to its tile's count (``density_map``)."""
    out = np.zeros((len(points), size, size), np.float32)
    for i, p in enumerate(points):
        if len(p):
            out[i] = density_map(p, size, size, sigma)
    return out


def density_store(tile_store, sigma: float):
    """Where the targets for this tile cache and sigma live: a folder beside ``tiles`` (its own
    folder, so a node that copied the tiles before the targets existed still fetches them)."""
    return tile_store.child(f"density-sigma{float(sigma):g}")


def ensure_density_targets(tile_store, tiles, sigma: float) -> tuple[object, bool]:
    """The targets of ``tiles`` (a TileSet of ``tile_store``'s cache) in storage, made once;
    returns (their folder, True if they were already there)."""
    store = density_store(tile_store, sigma)
    if store.exists(DENSITY_FILE):
        return store, True
    import io

    buffer = io.BytesIO()
    # float16: half the bytes a batch gathers; a map's sum stays within ~1e-3 of the count
    np.save(buffer, density_targets(tiles.points, int(tiles.images.shape[1]), sigma).astype(np.float16))
    store.write_bytes(DENSITY_FILE, buffer.getvalue())  # published whole (storage.write_bytes)
    return store, False


def load_density_targets(store) -> np.ndarray:
    """The targets (N, T, T) float16, memory-mapped from this node's copy."""
    return np.load(store.localize() / DENSITY_FILE, mmap_mode="r")


class TileLoader:
    """Batches of one worker's shard, as device tensors.

    ``images`` (N, T, T, 3) uint8 and ``targets`` (N, T, T) (float16 as stored, or float32;
    arrays or memory maps) are gathered once at ``shard`` (tile indices) into RAM;
    ``epoch(order, key)`` then yields ``(x (B, 3, T, T) float32 in [0, 1], target (B, 1, T, T)
    float32 x scale)`` on ``device`` for each whole batch of ``order`` (positions in the shard;
    the remainder is dropped). ``augment`` (a ``PhotoDegradation`` or None) degrades the copy of
    a batch's images, never the shard held here, with draws seeded by ``key`` and the batch.
    """

    def __init__(self, images, targets, shard, batch_size: int, scale: float, device="cpu",
                 depth: int = 3, threads: int = 1, channels_last: bool = False, augment=None):
        shard = np.asarray(shard, dtype=np.int64)
        ordered = np.argsort(shard, kind="stable")  # read the memory maps front to back
        held_images = np.empty((len(shard),) + tuple(images.shape[1:]), np.uint8)
        held_targets = np.empty((len(shard),) + tuple(targets.shape[1:]), np.float16)
        held_images[ordered] = images[shard[ordered]]
        held_targets[ordered] = targets[shard[ordered]]
        self.images, self.targets = torch.from_numpy(held_images), torch.from_numpy(held_targets)
        self.batch, self.scale = int(batch_size), float(scale)
        self.device = torch.device(device)
        self.depth, self.threads = max(1, int(depth)), max(1, int(threads))
        self.channels_last = bool(channels_last)
        self.augment = augment
        self.cuda = self.device.type == "cuda"
        # CUDA: depth batches in flight plus the one being copied, in pinned buffers that are
        # reused, so a job never waits for a buffer only a later job would free
        self.free: queue.Queue = queue.Queue()
        for _ in range(self.depth + 1 if self.cuda else 0):
            self.free.put((torch.empty((self.batch,) + tuple(self.images.shape[1:]), dtype=torch.uint8, pin_memory=True),
                           torch.empty((self.batch,) + tuple(self.targets.shape[1:]), dtype=torch.float16, pin_memory=True),
                           None))

    def __len__(self) -> int:
        return len(self.images)

    def _finish(self, images: torch.Tensor, targets: torch.Tensor):
        """uint8 NHWC -> float NCHW in [0, 1] (the permuted view has channels_last strides), and
        the targets x scale as float32: on the device for CUDA, in the loader thread on the CPU."""
        x = images.permute(0, 3, 1, 2).float().div_(255.0)
        if not self.channels_last:
            x = x.contiguous()
        return x, targets.unsqueeze(1).float().mul_(self.scale)

    def _fill(self, positions: np.ndarray, rng: np.random.Generator | None):
        index = torch.from_numpy(positions)
        if not self.cuda:  # CPU: the finished batch, made off the step's thread
            x = torch.index_select(self.images, 0, index)
            if self.augment is not None:
                self.augment(x.numpy(), rng)  # in place on the gathered copy (.numpy() shares it)
            return self._finish(x, torch.index_select(self.targets, 0, index))
        x, y, copied = self.free.get()
        if copied is not None:
            copied.synchronize()  # the last copy out of these pinned buffers has finished
        torch.index_select(self.images, 0, index, out=x)
        torch.index_select(self.targets, 0, index, out=y)
        if self.augment is not None:
            self.augment(x.numpy(), rng)  # on the host, before the copy: uint8 travels as before
        return x, y

    def _to_device(self, x: torch.Tensor, y: torch.Tensor):
        if not self.cuda:
            return x, y
        xd, yd = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.free.put((x, y, event))  # refilled once the copies above have run
        return self._finish(xd, yd)

    def _submit(self, pool: ThreadPoolExecutor, order: np.ndarray, start: int, key: tuple[int, ...]):
        """The batch of ``order`` that begins at ``start``, made by a loader thread."""
        rng = batch_rng(key, start // self.batch) if self.augment is not None else None
        return pool.submit(self._fill, order[start:start + self.batch], rng)

    def epoch(self, order, key: tuple[int, ...] = (0,)):
        """Yield the device batches of ``order`` (shard positions), ``depth`` made ahead; ``key``
        (the run's seed, the epoch, the rank) seeds the augmentation of each batch."""
        order = np.asarray(order, dtype=np.int64)
        jobs = iter(range(0, len(order) - self.batch + 1, self.batch))
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="flower-loader")
        pending: list = []
        try:
            for start in jobs:
                pending.append(self._submit(pool, order, start, key))
                if len(pending) >= self.depth:
                    break
            while pending:
                x, y = pending.pop(0).result()
                start = next(jobs, None)
                if start is not None:
                    pending.append(self._submit(pool, order, start, key))
                yield self._to_device(x, y)
        finally:
            for job in pending:
                job.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            if self.cuda:  # buffers of jobs nobody consumed go back for the next epoch
                for job in pending:
                    if job.done() and not job.cancelled() and job.exception() is None:
                        self.free.put((*job.result(), None))


def loader_images_per_s(tile_size: int = 224, batch_size: int = 64, batches: int = 40, threads: int = 1,
                        device: str = "cpu", gather_only: bool = False, tiles: int = 512, seed: int = 0) -> float:
    """Images/s the loader makes on random tiles held in RAM, no model: what ``epoch`` hands the
    step on ``device`` (on the CPU: float tensors), or with ``gather_only`` the host's whole
    share of a CUDA batch (the two gathers into reused buffers, pinned where CUDA exists).
    For the benchmark runner; no test asserts it."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, (tiles, tile_size, tile_size, 3), dtype=np.uint8)
    targets = rng.random((tiles, tile_size, tile_size), dtype=np.float32).astype(np.float16)
    torch.set_num_threads(max(1, threads))
    loader = TileLoader(images, targets, np.arange(tiles), batch_size, 100.0, device, threads=threads)
    if gather_only:
        pin = torch.cuda.is_available()
        x = torch.empty((batch_size, tile_size, tile_size, 3), dtype=torch.uint8, pin_memory=pin)
        y = torch.empty((batch_size, tile_size, tile_size), dtype=torch.float16, pin_memory=pin)
        orders = [torch.from_numpy(rng.permutation(tiles)[:batch_size]) for _ in range(8)]
        started = time.perf_counter()
        for i in range(batches):
            torch.index_select(loader.images, 0, orders[i % 8], out=x)
            torch.index_select(loader.targets, 0, orders[i % 8], out=y)
        return batches * batch_size / (time.perf_counter() - started)
    made, started = 0, None
    while made < batches:
        for _ in loader.epoch(rng.permutation(tiles)):
            if started is None:  # the first batch pays the threads' start: leave it out
                started = time.perf_counter()
                continue
            made += 1
            if made >= batches:
                break
    if loader.cuda:
        torch.cuda.synchronize(loader.device)
    return made * batch_size / (time.perf_counter() - started)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="flower's loader alone: images/s it makes, no model")
    parser.add_argument("--tile-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = parser.parse_args()
    setting = f"tile {a.tile_size}, batch {a.batch_size}, {a.threads} thread(s)"
    gathered = loader_images_per_s(a.tile_size, a.batch_size, a.batches, a.threads, a.device, gather_only=True)
    print(f"flower loader, host gather (a CUDA batch's CPU work): {gathered:,.0f} images/s ({setting})")
    handed = loader_images_per_s(a.tile_size, a.batch_size, a.batches, a.threads, a.device)
    print(f"flower loader, batches on {a.device}: {handed:,.0f} images/s ({setting})")
