"""workload=flower's input side and inference: its tile loader against torch's DataLoader, and the
CNN's inference against the thesis's blob counter.

    python -m bench flower_loader        # ~3 min on 2 idle cores (3 repeats)

1. The loader (``workloads/flower/loader.py``, ``TileLoader``) against ``torch.utils.data.DataLoader``
   over the same tiles held in RAM, both making the same batches: tile 224 (the thesis's), batch 64,
   uint8 NHWC tiles and float16 density targets in, ``x`` (B, 3, T, T) float32 in [0, 1] and the
   targets (B, 1, T, T) float32 x scale out, in a shuffled order. DataLoader is set up as its docs
   recommend for a map-style dataset: ``num_workers`` = the threads given to orchard (0 for one
   thread: the main process does the work, as orchard's single loader thread does), the conversion
   in ``collate_fn`` so that it runs in the workers, ``persistent_workers`` with workers (their start
   is paid once, before timing), ``pin_memory`` only where CUDA exists. A second row times the host's
   share of a CUDA batch alone (the two gathers into reused buffers, on the loader's ``threads``
   threads, ``depth`` batches ahead, as ``TileLoader`` does on CUDA) against the DataLoader's
   uint8 batches (default collate, no conversion). Timed alike: one untimed warm-up epoch each,
   then ``batches`` batches wall to wall. Quality: each side's first batch checksum (the same tiles
   in the same order must give the same float sum).
2. Inference: tiles/s of the CNN (``FlowerCounterCNN``, eval, no grad, torch on all cores) against
   the blob counter (``baseline_counter.count_blobs``, the thesis's DoH on the CIELab yellowness,
   one process per core) on the same random tiles. The thesis's 7.5x CNN speed-up (5.1.3) was on a
   GPU; this row says which device it ran on. Untrained weights: inference costs the same.
"""
from __future__ import annotations

import os
import queue
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np

SIZES = {"full": {"tile": 224, "batch": 64, "tiles": 512, "batches": 40, "infer_tiles": 64},
         "smoke": {"tile": 32, "batch": 8, "tiles": 64, "batches": 4, "infer_tiles": 4}}
ESTIMATE = "~3 min on 2 idle cores (3 repeats)"
SCALE = 100.0
INFER_BATCH = 8  # tiles per CNN forward in the inference row


def tiles_in_ram(n: int, tile: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, (n, tile, tile, 3), dtype=np.uint8)
    targets = rng.random((n, tile, tile), dtype=np.float32).astype(np.float16)
    return images, targets


class TileDataset:
    """The map-style dataset a hand-written DataLoader pipeline indexes: one tile per item."""

    def __init__(self, images: np.ndarray, targets: np.ndarray):
        self.images, self.targets = images, targets

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], self.targets[i]


def collate_floats(items):
    """The same batch orchard's loader hands the step: float NCHW in [0, 1] and scaled targets."""
    import torch

    x = torch.from_numpy(np.stack([i for i, _ in items])).permute(0, 3, 1, 2).float().div_(255.0).contiguous()
    y = torch.from_numpy(np.stack([t for _, t in items])).unsqueeze(1).float().mul_(SCALE)
    return x, y


def collate_uint8(items):
    import torch

    return torch.from_numpy(np.stack([i for i, _ in items])), torch.from_numpy(np.stack([t for _, t in items]))


def time_batches(batches_of, n: int) -> tuple[float, float]:
    """(images/s over n batches after one untimed warm-up epoch, the first timed batch's checksum)."""
    for _ in batches_of():  # warm-up: threads or worker processes started, pages touched
        pass
    made, checksum, t0 = 0, None, time.perf_counter()
    batch = 0
    while made < n:
        for x, _ in batches_of():
            if checksum is None:
                checksum = float(x.double().sum())
            batch = len(x)
            made += 1
            if made >= n:
                break
    return made * batch / (time.perf_counter() - t0), checksum


def orchard_loader(images, targets, size: dict, threads: int, floats: bool):
    import torch

    from workloads.flower.loader import TileLoader

    torch.set_num_threads(threads)
    loader = TileLoader(images, targets, np.arange(len(images)), size["batch"], SCALE, "cpu", threads=threads)
    order = np.random.default_rng(1).permutation(len(images))
    if floats:
        return lambda: loader.epoch(order)
    # the host's share of a CUDA batch, as the loader does it on CUDA: `threads` loader threads
    # make the two gathers into reused (pinned where CUDA exists) buffers, `depth` batches ahead
    pin = torch.cuda.is_available()
    held = [(torch.empty((size["batch"],) + images.shape[1:], dtype=torch.uint8, pin_memory=pin),
             torch.empty((size["batch"],) + targets.shape[1:], dtype=torch.float16, pin_memory=pin))
            for _ in range(loader.depth + 1)]  # depth in flight + the one the step holds

    def fill(buffers, start):
        x, y = buffers.get()
        index = torch.from_numpy(order[start:start + size["batch"]])
        torch.index_select(loader.images, 0, index, out=x)
        torch.index_select(loader.targets, 0, index, out=y)
        return x, y

    def gathers():
        buffers: queue.Queue = queue.Queue()  # all free at an epoch's start, even after a break
        for pair in held:
            buffers.put(pair)
        starts = iter(range(0, len(order) - size["batch"] + 1, size["batch"]))
        with ThreadPoolExecutor(threads) as pool:
            pending = [pool.submit(fill, buffers, s) for _, s in zip(range(loader.depth), starts)]
            while pending:
                x, y = pending.pop(0).result()
                start = next(starts, None)
                if start is not None:
                    pending.append(pool.submit(fill, buffers, start))
                yield x, y
                buffers.put((x, y))  # consumed: the copy to the device would have been queued
    return gathers


def torch_loader(images, targets, size: dict, threads: int, floats: bool):
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(threads)
    workers = 0 if threads == 1 else threads
    order = np.random.default_rng(1).permutation(len(images))
    loader = DataLoader(TileDataset(images, targets), batch_size=size["batch"], sampler=order.tolist(),
                        drop_last=True, num_workers=workers, persistent_workers=workers > 0,
                        pin_memory=torch.cuda.is_available(), collate_fn=collate_floats if floats else collate_uint8)
    return lambda: iter(loader)


def _blob_counts(tiles: np.ndarray) -> int:
    from workloads.flower.baseline_counter import count_blobs

    params = {"cutoff": 0.55, "gain": 10.0, "threshold": 0.01, "min_sigma": 2.0, "max_sigma": 8.0}
    return sum(len(count_blobs(t, **params)) for t in tiles)


def inference_rates(size: dict, cores: int) -> tuple[float, float, str]:
    """(CNN tiles/s, blob counter tiles/s, device) on the same tiles, all cores each."""
    import torch

    from workloads.flower.model import FlowerCounterCNN

    tiles, _ = tiles_in_ram(size["infer_tiles"], size["tile"], seed=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(cores)
    model = FlowerCounterCNN().eval().to(device)
    x = torch.from_numpy(tiles).permute(0, 3, 1, 2).float().div_(255.0).contiguous().to(device)
    batch = min(INFER_BATCH, len(x))
    with torch.inference_mode():
        model(x[:batch]).sum(dim=(1, 2, 3)).cpu()  # warm-up at the timed shape: kernels chosen, memory allocated
        t0 = time.perf_counter()
        for start in range(0, len(x), batch):  # .cpu() waits for the device: the counts are the output
            model(x[start:start + batch]).sum(dim=(1, 2, 3)).cpu()
        cnn = len(x) / (time.perf_counter() - t0)
    chunks = [c for c in np.array_split(tiles, cores) if len(c)]
    with ProcessPoolExecutor(cores) as pool:
        list(pool.map(_blob_counts, [c[:1] for c in chunks]))  # processes started, skimage imported
        t0 = time.perf_counter()
        list(pool.map(_blob_counts, chunks))
        blob = len(tiles) / (time.perf_counter() - t0)
    return cnn, blob, device


def measure(size: dict, repeats: int) -> list[dict]:
    from bench.rows import row

    cores = os.cpu_count() or 1
    images, targets = tiles_in_ram(size["tiles"], size["tile"])
    setting = f"tile {size['tile']}, batch {size['batch']}"
    rows = []
    for floats, what in ((True, "float batches on the CPU"), (False, "host gather (a CUDA batch's CPU work)")):
        for threads in sorted({1, min(2, cores)}):
            o, p = [], []
            for _ in range(repeats):  # alternate, so a change of load hits both
                o.append(time_batches(orchard_loader(images, targets, size, threads, floats), size["batches"]))
                p.append(time_batches(torch_loader(images, targets, size, threads, floats), size["batches"]))
            same = "equal to orchard's" if abs(o[-1][1] - p[-1][1]) <= 1e-6 * abs(o[-1][1]) else \
                f"DIFFERS ({p[-1][1]:.6g} vs {o[-1][1]:.6g})"
            rows.append(row(f"flower loader, {what}, {setting}, {threads} thread(s)", "images/s",
                            [v for v, _ in o], [v for v, _ in p], higher_is_better=True,
                            orchard_label=f"TileLoader, {threads} thread(s)",
                            peer_label=f"torch DataLoader, num_workers={0 if threads == 1 else threads}",
                            quality={"orchard": {"first batch sum": o[-1][1]}, "peer": {"first batch": same}}))
    runs = [inference_rates(size, cores) for _ in range(repeats)]
    device = runs[-1][2]
    rows.append(row(f"flower inference on {device.upper()}, tile {size['tile']}: CNN vs blob counter, {cores} cores",
                    "tiles/s",
                    [r[0] for r in runs], [r[1] for r in runs], higher_is_better=True,
                    orchard_label=f"FlowerCounterCNN on {device}", peer_label=f"blob counter (DoH), {cores} processes",
                    quality={"orchard": {"device": device}, "peer": {"device": "cpu"}},
                    note="the thesis's 7.5x CNN speed-up (5.1.3) was measured on a GPU"))
    return rows
