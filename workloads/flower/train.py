"""The per-worker training loop: the same code for ring, ps-sync and ps-async.

It only uses `orchard.strategies.worker` (env, replica, checkpoints), so the model never knows
how it is distributed. Per step it records what the thesis measured (4.2): loss, MAE of the
batch's counts, and throughput = images of the step / duration of the step; every
`profile_every` steps one step runs under the torch profiler and its Chrome trace is kept
(the thesis's TF Timeline every 500 steps, 5.2.3). At the end each worker writes its own
completion time and throughput series to workers/rank<r>.json in the run storage for the driver
(orchard/storage.py: a bucket on a cluster; nothing here opens a path only the driver wrote).
"""
from __future__ import annotations

import io
import os
import tempfile
import queue
import threading
import time
from pathlib import Path

import numpy as np
import torch

from workloads.flower.data import TileSet
from workloads.flower.density_map import density_map
from workloads.flower.model import FlowerCounterCNN, euclidean_loss

MODEL_FILE = "model.pt"


def make_batch(tiles: TileSet, indices: np.ndarray, sigma: float, scale: float):
    """Images (B, 3, T, T) float in [0, 1] and target density maps (B, 1, T, T) x scale."""
    images = np.asarray(tiles.images[indices])  # fancy indexing copies out of the memory map
    size = images.shape[1]
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    maps = np.stack([density_map(tiles.points[i], size, size, sigma) for i in indices])
    return x, torch.from_numpy(maps).unsqueeze(1).mul_(scale)


def prefetched_batches(tiles: TileSet, order: np.ndarray, batch_size: int, depth: int,
                       sigma: float, scale: float):
    """Yield batches of `order` built by a background thread `depth` batches ahead (4.4.5)."""
    slots: queue.Queue = queue.Queue(maxsize=max(1, depth))
    done = object()
    stop = threading.Event()

    def produce():
        for start in range(0, len(order) - batch_size + 1, batch_size):  # drop the remainder
            if stop.is_set():
                return
            slots.put(make_batch(tiles, order[start:start + batch_size], sigma, scale))
        slots.put(done)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while (item := slots.get()) is not done:
            yield item
    finally:
        stop.set()


def _profile_step(run_step, trace_path: Path) -> None:
    """Run one training step under the torch profiler and write its Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run_step()
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace_path))


def _gpu_util(device: torch.device) -> float | None:
    """This worker's GPU utilization in percent (NVML), or None on CPU."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.utilization(device))
    except Exception:  # no NVML bindings: the core's resource sampler still covers it
        return None


def _maybe_inject_fault(config: dict, env, run_storage, epoch: int, ctx) -> None:
    """flower.fail_at_epoch: the last worker's process dies once, at the first step of that epoch.

    A marker file makes it happen once per run, so the restarted worker group (FailureConfig)
    trains on from the last checkpoint instead of dying again.
    """
    fail_at = config.get("fail_at_epoch")
    if fail_at is None or epoch != int(fail_at) or env.rank != env.world_size - 1:
        return
    if run_storage.exists("fault_injected"):
        return
    run_storage.write_bytes("fault_injected", b"1")
    ctx.flush()
    # Ray Train's controller collects reports (and so registers the last checkpoint) when it
    # polls the workers, every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s); dying right after a report
    # could beat that poll and lose the checkpoint, which is not the failure this simulates.
    time.sleep(3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 2.0)))
    os._exit(1)  # a hard crash, like a killed process: no Python cleanup, no report


@torch.no_grad()
def validation_mae(model, tiles: TileSet, val_idx: list[int], scale: float, device) -> float:
    """Count MAE on the held-back tiles, on rank 0 alone: through the plain module, so DDP's
    forward (which syncs buffers with the other ranks) is not entered by one rank only."""
    from workloads.flower.evaluate import predict_density

    plain = getattr(model, "module", model)
    was_training = plain.training
    plain.eval()
    try:
        maps, _ = predict_density(plain, np.asarray(tiles.images[np.asarray(val_idx)]), scale, device=str(device))
    finally:
        plain.train(was_training)
    return float(np.abs(maps.sum(axis=(1, 2)) - tiles.counts[np.asarray(val_idx)]).mean())


def train_loop(config: dict) -> None:
    """Ray Train worker entry point; config = the loop config of `driver.run_train` + ctx, strategy (+ ps_group)."""
    from orchard.strategies import worker

    started = time.time()
    ctx = config["ctx"]
    # [1] who am I: rank, world size, device
    env = worker.env(config)
    torch.set_num_threads(max(1, int(config["strategy"].get("cpus_per_worker", 1))))
    run_storage = config["run_storage"]  # orchard.storage.Storage: this run's folder in storage

    # [2] this worker's shard of the training tiles (4.4.5: N shards for N workers)
    cache = config["cache"]  # the tile cache in storage, copied once to this node (a local root: in place)
    tiles = TileSet(cache.localize() if hasattr(cache, "localize") else cache)
    order = np.random.default_rng(config["seed"]).permutation(np.asarray(config["train_idx"]))
    shard = np.asarray(env.shard(order))
    batch = int(config["batch_size"])
    steps_per_epoch = len(shard) // batch
    if steps_per_epoch == 0:
        raise ValueError(f"worker {env.rank}: {len(shard)} training tiles, fewer than one batch of {batch}")

    # [3] the model, the same for every strategy; the replica hides how it is synchronised
    torch.manual_seed(config["seed"])
    model = FlowerCounterCNN().to(env.device)
    replica = worker.replica(model, config["optimizer"], config)
    first_epoch = 0
    restored = worker.load_checkpoint()
    if restored is not None:
        state, epoch = restored
        replica.load_state_dict(state)
        first_epoch = epoch + 1

    scale, sigma = float(config["density_scale"]), float(config["sigma"])
    profile_every = int(config["profile_every"])
    series: list[float] = []
    losses: list[float] = []
    gpu_util: list[float] = []
    global_step = first_epoch * steps_per_epoch
    epochs = int(config["epochs"])
    for epoch in range(first_epoch, epochs):
        # [4] a new shuffle of this worker's shard every epoch, prefetched `prefetch` batches ahead
        shuffled = np.random.default_rng((config["seed"], epoch, env.rank)).permutation(shard)
        _maybe_inject_fault(config, env, run_storage, epoch, ctx)
        batches = prefetched_batches(tiles, shuffled, batch, int(config["prefetch"]), sigma, scale)
        tick = time.perf_counter()
        for x, target in batches:
            x, target = x.to(env.device, non_blocking=True), target.to(env.device, non_blocking=True)
            out = {}

            def run_step():
                # [5] forward, pixel-wise Euclidean loss, backward, synchronise + update
                predicted = replica.model(x)
                loss = euclidean_loss(predicted, target)
                replica.zero_grad()
                loss.backward()
                replica.step()
                out["loss"] = float(loss.detach())
                out["mae"] = float((predicted.detach().sum(dim=(1, 2, 3)) - target.sum(dim=(1, 2, 3))).abs().mean()) / scale

            if profile_every > 0 and global_step % profile_every == 0 and global_step > 0:
                trace = Path(tempfile.gettempdir()) / f"orchard-traces-{os.getpid()}" / f"rank{env.rank}_step{global_step}.json"
                _profile_step(run_step, trace)
                ctx.log_artifact(trace, "traces")
            else:
                run_step()
            # [6] per-step metrics: throughput counts the wait for the batch too, like a TF step
            now = time.perf_counter()
            images_per_s = len(x) / max(now - tick, 1e-9)
            tick = now
            series.append(images_per_s)
            losses.append(out["loss"])
            metrics = {f"throughput/w{env.rank}_images_per_s": images_per_s}
            if env.rank == 0:
                metrics.update({"train/loss": out["loss"], "train/mae": out["mae"],
                                "throughput/images_per_s": images_per_s * env.world_size})
            util = _gpu_util(env.device)
            if util is not None:
                gpu_util.append(util)
                metrics[f"system/w{env.rank}_gpu_util_pct"] = util  # MLflow system metric, per worker
            if env.rank == 0:
                ctx.progress(global_step + 1, epochs * steps_per_epoch, desc=f"epoch {epoch + 1}/{epochs}",
                             **{"img/s": images_per_s * env.world_size})
            ctx.log_metrics(metrics, step=global_step)
            global_step += 1

        # [7] checkpoint every `checkpoint_every` epochs and after the last one (every rank reports)
        last = epoch == epochs - 1
        if last or (epoch + 1) % int(config["checkpoint_every"]) == 0:
            recent = losses[-steps_per_epoch:] or [float("nan")]
            worker.save_checkpoint(replica.state_dict(), {"train/epoch_loss": float(np.mean(recent))}, epoch)
        if env.rank == 0:
            epoch_metrics = {"train/epoch": epoch + 1}
            if config.get("val_idx") and (epoch + 1) % int(config.get("val_every", 1)) == 0:
                epoch_metrics["val/mae"] = validation_mae(replica.model, tiles, config["val_idx"], scale, env.device)
            ctx.log_metrics(epoch_metrics, step=global_step)

    # [8] hand the driver this worker's completion time and throughput; rank 0 keeps the model
    summary = {"rank": env.rank, "completion_s": time.time() - started, "throughput": series,
               "first_epoch": first_epoch, "gpu_util": gpu_util}
    run_storage.write_json(f"workers/rank{env.rank}.json", summary)
    if env.rank == 0:
        module = getattr(replica, "module", model)
        buffer = io.BytesIO()
        torch.save({"model": module.state_dict(), "density_scale": scale, "tile_size": int(tiles.images.shape[1])},
                   buffer)
        run_storage.write_bytes(MODEL_FILE, buffer.getvalue())


def load_model(path: str | Path, device: str = "cpu") -> tuple[FlowerCounterCNN, float]:
    """The trained model saved by `train_loop` (weights only) and its density scale."""
    data = torch.load(Path(path), map_location=device, weights_only=True)
    model = FlowerCounterCNN()
    model.load_state_dict(data["model"])
    return model.eval(), float(data["density_scale"])
