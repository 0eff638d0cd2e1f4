"""The per-worker training loop: the same code for ring, ps-sync and ps-async.

It only uses `orchard.strategies.worker` (env, replica, checkpoints), so the model never knows
how it is distributed. It records what the thesis measured (4.2) per logged window of
`log_every` steps (1: every step; the first `warmup_steps` steps are windows of their own):
loss and count MAE (added up on the device, read once per window, so the step never waits for
a GPU) and throughput = images of the window / its duration; every
`profile_every` steps one step runs under the torch profiler and its Chrome trace is kept
(the thesis's TF Timeline every 500 steps, 5.2.3). At the end each worker writes its own
completion time and throughput series to workers/rank<r>.json in the run storage for the driver
(orchard/storage/: a bucket on a cluster; nothing here opens a path only the driver wrote).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from orchard.api import background, Diverged, divergence, private_tmp

from .checkpoint import save_weights
from .model import euclidean_loss, FlowerCounterCNN
from .tiles import TileSet

DIVERGED_FILE = "diverged.json"  # in the run storage: where training went non-finite (orchard/run/divergence.py)


def trace_step(run_step, trace_path: Path) -> None:
    """Run one training step under the torch profiler and write its Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run_step()
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace_path))


def profiled_step(run_step, ctx, rank: int, step: int) -> None:
    """Run one step under the profiler and log its trace as ``traces/rank<r>_step<s>.json``.
    The trace is written in this user's own 0700 folder (``private_tmp``: never a guessable /tmp
    path another user could read or plant), sent to the run, then removed: nothing piles up."""
    with tempfile.TemporaryDirectory(prefix="traces-", dir=private_tmp()) as tmp:
        trace = Path(tmp) / f"rank{rank}_step{step}.json"
        trace_step(run_step, trace)
        ctx.log_artifact(trace, "traces")


def _gpu_util(device: torch.device) -> float | None:
    """This worker's GPU utilization in percent (NVML), or None on CPU."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.utilization(device))
    except Exception:  # no NVML bindings: the core's resource sampler still covers it
        return None


def _maybe_inject_fault(config: dict, env, epoch: int, ctx) -> None:
    """flower.fail_at_epoch: the last worker's process dies once, at the first step of that epoch.

    A marker file makes it happen once per run, so the restarted worker group (FailureConfig)
    trains on from the last checkpoint instead of dying again.
    """
    fail_at = config.get("fail_at_epoch")
    if fail_at is None or epoch != int(fail_at) or env.rank != env.world_size - 1:
        return
    if ctx.storage.exists("fault_injected"):
        return
    ctx.storage.write_bytes("fault_injected", b"1")
    ctx.flush()
    # Ray Train's controller collects reports (and so registers the last checkpoint) when it
    # polls the workers, every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s); dying right after a report
    # could beat that poll and lose the checkpoint, which is not the failure this simulates.
    time.sleep(3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 2.0)))
    os._exit(1)  # a hard crash, like a killed process: no Python cleanup, no report


@torch.no_grad()
def validation_mae(model, tiles: TileSet, val_idx: list[int], scale: float, device, batch_size: int = 32) -> float:
    """Count MAE on the held-back tiles, on rank 0 alone: through the plain module, so DDP's
    forward (which syncs buffers with the other ranks) is not entered by one rank only."""
    from .evaluate import predict_density

    plain = getattr(model, "module", model)
    was_training = plain.training
    plain.eval()
    try:
        maps, _ = predict_density(plain, np.asarray(tiles.images[np.asarray(val_idx)]), scale, batch_size, device)
    finally:
        plain.train(was_training)
    return float(np.abs(maps.sum(axis=(1, 2)) - tiles.counts[np.asarray(val_idx)]).mean())


class GpuSampler:
    """This worker's GPU utilization, read by a background thread once a second while the loop
    trains (NVML via torch): the training window of its own GPU, with no call inside the step."""

    def __init__(self, device: torch.device, every_s: float = 1.0):
        self.device, self.every_s = device, every_s
        self.samples: list[float] = []
        self._poller = background.Poller(self._sample, every_s, "flower-gpu-sampler")
        if _gpu_util(device) is not None:
            self._poller.start()

    def _sample(self) -> None:
        util = _gpu_util(self.device)
        if util is not None:
            self.samples.append(util)

    def since(self, start: int) -> list[float]:
        return self.samples[start:]

    def stop(self) -> list[float]:
        self._poller.stop(timeout_s=5)
        return list(self.samples)


def train_step(forward, replica, precision, x: torch.Tensor, target: torch.Tensor, sums: torch.Tensor) -> None:
    """One step: forward under ``precision``'s autocast, the Euclidean loss in float32,
    backward, the replica's update; adds (loss, batch count MAE x scale) into ``sums`` on the
    device, so nothing here waits for a GPU."""
    with precision.autocast():
        predicted = forward(x)
    predicted = predicted.float()
    loss = euclidean_loss(predicted, target)
    replica.zero_grad()
    precision.backward(loss)
    precision.step(replica)
    count_error = (predicted.detach().sum(dim=(1, 2, 3)) - target.sum(dim=(1, 2, 3))).abs().mean()
    sums.add_(torch.stack([loss.detach(), count_error]))


def raise_if_diverged(ctx, train_store) -> None:
    """On the driver, after Ray Train returned or raised: a worker's ``diverged`` record becomes
    the run's ``Diverged`` (``train/diverged_at_step`` logged), its ``checkpoint`` saying whether
    Ray Train kept one (of finite weights: none other is ever reported) to resume from."""
    if not ctx.storage.exists(DIVERGED_FILE):
        return
    err = Diverged(**ctx.storage.read_json(DIVERGED_FILE))
    err.checkpoint = any(name.startswith("checkpoint_") for name in train_store.list("flower"))
    divergence.log(ctx, err)
    raise err


def lr_advice(config: dict) -> dict:
    """What a diverged run's line names: the optimizer's lr, and fp32 when autocast is on."""
    precision = config.get("precision", "fp32")
    return {"key": "flower.optimizer.lr", "value": float(config["optimizer"]["lr"]),
            "hint": f"use flower.precision=fp32 (now {precision})" if precision != "fp32" else ""}


def loader_threads(config: dict, device: torch.device) -> int:
    """flower.loader_threads, or (null) the worker's CPUs but one on a GPU (the step needs the
    CPU only to launch kernels), and one on a CPU (torch's own threads do the step there)."""
    threads = config.get("loader_threads")
    if threads:
        return int(threads)
    cpus = max(1, int(config["strategy"].get("cpus_per_worker", 1)))
    return max(1, cpus - 1) if device.type == "cuda" else 1


def train_loop(config: dict) -> None:
    """Ray Train worker entry point; config = `loop_config` + ctx, strategy (+ ps_group).

    A worker that sees the run diverge (``Diverged``) writes where to the run storage and raises,
    which ends its whole group (peers may wait in an all-reduce); the group Ray Train starts again
    reads that record and ends at once, and the driver raises it again (``raise_if_diverged``)."""
    run_storage = config["ctx"].storage  # this run's folder in the storage location, on every node
    if run_storage.exists(DIVERGED_FILE):
        return  # started again after a worker saw the run diverge: nothing to train
    try:
        _train(config)
    except Diverged as err:
        run_storage.write_json(DIVERGED_FILE, err.fields())
        raise


def _train(config: dict) -> None:
    from orchard.api import worker
    from .loader import TileLoader, load_density_targets
    from .photo_augment import PhotoDegradation
    from .precision import Precision, compiled, prepare_model

    from orchard.api import evicted_bytes

    # durations in this process by the monotonic clock: the wall clock can step (NTP, a VM paused
    # and resumed: once here it jumped ~19 s inside a run); the wall clock only for the moments
    # the driver compares with its own (first_step_at, last_step_at)
    started, evicted_from = time.perf_counter(), evicted_bytes()
    ctx = config["ctx"]
    # [1] who am I: rank, world size, device
    env = worker.env(config)
    torch.set_num_threads(max(1, int(config["strategy"].get("cpus_per_worker", 1))))

    # [2] this worker's shard of the training tiles (4.4.5: N shards for N workers), held in RAM
    #     with its density targets (made once, beside the tile cache in storage: loader.py); each
    #     batch's tiles degraded as a camera's photos are (flower.augment: photo_augment.py)
    cache = config["cache"]  # the tile cache in storage, copied once to this node (a local root: in place)
    tiles = TileSet(cache.localize() if hasattr(cache, "localize") else cache)
    order = np.random.default_rng(config["seed"]).permutation(np.asarray(config["train_idx"]))
    shard = np.asarray(env.shard(order))
    batch = int(config["batch_size"])
    steps_per_epoch = len(shard) // batch
    if steps_per_epoch == 0:  # the driver refuses this before Train starts; a guard for other callers
        raise ValueError(f"worker {env.rank}: {len(shard)} training tiles, fewer than one batch of {batch}")
    scale = float(config["density_scale"])
    channels_last = bool(config.get("channels_last", False))
    loader = TileLoader(tiles.images, load_density_targets(config["density"]), shard, batch, scale, env.device,
                        depth=int(config["prefetch"]), threads=loader_threads(config, env.device),
                        channels_last=channels_last, augment=PhotoDegradation.from_config(config.get("augment")))

    # [3] the model, the same for every strategy; the replica hides how it is synchronised
    torch.manual_seed(config["seed"])
    model = prepare_model(FlowerCounterCNN().to(env.device), channels_last)
    replica = worker.replica(model, config["optimizer"], config)
    precision = Precision(config.get("precision", "fp32"), env.device)
    forward = compiled(replica.model, bool(config.get("compile", False)))
    first_epoch = 0
    # the run's steps so far, carried in the checkpoint: the metrics' step. Counted from the epoch,
    # it depended on the group's size (a worker's steps an epoch), and an elastic group grown back
    # from 1 worker to 2 logged its epochs at steps below the ones it had logged alone, so MLflow's
    # latest value (at the highest step) was an epoch from before the regrowth
    resumed_step = None
    restored = worker.load_checkpoint()
    if restored is not None:
        state, epoch = restored
        replica.load_state_dict(state)
        precision.load_state_dict(state.get("precision", {}))
        first_epoch = epoch + 1
        resumed_step = state.get("global_step")

    profile_every = int(config["profile_every"])
    log_every = max(1, int(config.get("log_every", 1)))
    warmup = int(config.get("warmup_steps", 0))
    series: list[float] = []      # images/s of each logged window (Table 5.2's per-step series)
    window_steps: list[int] = []  # steps in each window
    sampler = GpuSampler(env.device)
    global_step = int(resumed_step) if resumed_step is not None else first_epoch * steps_per_epoch
    steps_run, steps_s, first_step_at, last_step_at = 0, 0.0, None, None
    steps_cpu_s = 0.0  # this process's CPU time over the same windows: below steps_s, it waited for a core
    checkpoint_s = validation_s = 0.0  # where the loop's time goes besides steps (time_split)
    steps_from = None  # when the first epoch's step loop began: the loop's start ends there
    epochs = int(config["epochs"])
    advice = lr_advice(config)
    for epoch in range(first_epoch, epochs):
        # [4] a new shuffle of this worker's shard every epoch, `prefetch` batches made ahead
        #     (their degradations drawn from the same key and the batch's number: photo_augment.py)
        epoch_key = (config["seed"], epoch, env.rank)
        shuffled = np.random.default_rng(epoch_key).permutation(len(shard))
        _maybe_inject_fault(config, env, epoch, ctx)
        # loss and MAE add up on the device; the host reads them once per logged window, so the
        # step never waits for the GPU (a read is a sync)
        sums = torch.zeros(2, device=env.device)
        in_window, epoch_loss, epoch_steps = 0, 0.0, 0
        util_from = len(sampler.samples)
        steps_from = steps_from or time.perf_counter()
        tick, tick_cpu = time.perf_counter(), time.process_time()
        for i, (x, target) in enumerate(loader.epoch(shuffled, epoch_key)):
            if first_step_at is None:
                first_step_at = time.time()

            def run_step(x=x, target=target, sums=sums):
                # [5] forward (autocast), pixel-wise Euclidean loss, backward, synchronise + update
                train_step(forward, replica, precision, x, target, sums)

            if profile_every > 0 and global_step % profile_every == 0 and global_step > 0:
                profiled_step(run_step, ctx, env.rank, global_step)
            else:
                run_step()
            global_step += 1
            steps_run += 1
            in_window += 1
            if not (global_step % log_every == 0 or i == steps_per_epoch - 1 or steps_run <= warmup):
                continue
            # [6] the logged window: one read of the device sums; throughput = the window's images
            #     over its time, which counts the waits for batches too, like a TF step (exact:
            #     the read waits for the window's last step)
            loss_sum, mae_sum = sums.tolist()
            sums.zero_()
            # every rank checks its own loss: the first NaN/inf stops the run (orchard/run/divergence.py)
            divergence.check({"loss": loss_sum}, epoch=epoch + 1, step=global_step, **advice)
            now, now_cpu = time.perf_counter(), time.process_time()
            images_per_s = in_window * len(x) / max(now - tick, 1e-9)
            steps_s += now - tick
            steps_cpu_s += now_cpu - tick_cpu
            tick, tick_cpu, last_step_at = now, now_cpu, time.time()
            series.append(images_per_s)
            window_steps.append(in_window)
            epoch_loss, epoch_steps = epoch_loss + loss_sum, epoch_steps + in_window
            metrics = {f"throughput/w{env.rank}_images_per_s": images_per_s}
            if env.rank == 0:
                metrics.update({"train/loss": loss_sum / in_window, "train/mae": mae_sum / in_window / scale,
                                "throughput/images_per_s": images_per_s * env.world_size})
            util = sampler.since(util_from)
            if util:
                util_from += len(util)
                metrics[f"system/w{env.rank}_gpu_util_pct"] = float(np.mean(util))  # this worker's GPU
            if env.rank == 0:
                ctx.progress(epoch * steps_per_epoch + i + 1, epochs * steps_per_epoch, desc=f"epoch {epoch + 1}/{epochs}",
                             **{"img/s": images_per_s * env.world_size})
            ctx.log_metrics(metrics, step=global_step - 1)
            in_window = 0

        # [7] checkpoint every `checkpoint_every` epochs and after the last one (every rank reports)
        last = epoch == epochs - 1
        if last or (epoch + 1) % int(config["checkpoint_every"]) == 0:
            t0 = time.perf_counter()
            # the last update may have left non-finite weights: never a checkpoint of them
            divergence.check_weights(replica.module.parameters(), epoch=epoch + 1, step=global_step, **advice)
            state = {**replica.state_dict(), "precision": precision.state_dict(), "global_step": global_step}
            worker.save_checkpoint(state, {"train/epoch_loss": epoch_loss / max(epoch_steps, 1)}, epoch)
            checkpoint_s += time.perf_counter() - t0
        if env.rank == 0:
            epoch_metrics = {"train/epoch": epoch + 1}
            if config.get("val_idx") and (epoch + 1) % int(config.get("val_every", 1)) == 0:
                t0 = time.perf_counter()
                epoch_metrics["val/mae"] = validation_mae(replica.model, tiles, config["val_idx"], scale, env.device,
                                                          int(config.get("eval_batch_size", 32)))
                validation_s += time.perf_counter() - t0
            ctx.log_metrics(epoch_metrics, step=global_step)

    # [8] hand the driver this worker's completion time and throughput; rank 0 keeps the model
    summary = {"rank": env.rank, "completion_s": time.perf_counter() - started, "throughput": series,
               "window_steps": window_steps, "first_epoch": first_epoch, "gpu_util": sampler.stop(),
               "first_step_at": first_step_at, "last_step_at": last_step_at, "steps_s": steps_s,
               "steps_cpu_s": steps_cpu_s, "loop_start_s": (steps_from or time.perf_counter()) - started,
               "checkpoint_s": checkpoint_s, "validation_s": validation_s,
               **replica.comm_stats(),  # ps: the time this worker waited on the servers, bytes a step
               # what this worker's node cache evicted to copy its tiles (storage.node_cache_max_gb)
               "cache_evicted_bytes": evicted_bytes() - evicted_from, "pid": os.getpid()}
    ctx.storage.write_json(f"workers/rank{env.rank}.json", summary)
    if env.rank == 0:
        save_weights(ctx.storage, getattr(replica, "module", model), scale, int(tiles.images.shape[1]))

# --------------------------------------------------------------------------- on the driver
def loop_config(cfg: dict, tile_store, density, fit_idx, val_idx) -> dict:
    """What every worker's ``train_loop`` reads (the launcher adds ctx, strategy, ps_group):
    the tile cache and density targets in storage, this run's split and the flower settings."""
    f = cfg["flower"]
    return {
        "cache": tile_store.child("tiles"), "density": density, "train_idx": fit_idx.tolist(),
        "val_idx": val_idx.tolist(), "val_every": int(f.get("val_every", 1)),
        "seed": cfg["seed"], "batch_size": f["batch_size"], "prefetch": f["prefetch"], "epochs": f["epochs"],
        "density_scale": f["density_scale"], "optimizer": dict(f["optimizer"]),
        "profile_every": f["profile_every"], "checkpoint_every": cfg["strategy"].get("checkpoint_every", 1),
        "fail_at_epoch": f.get("fail_at_epoch"), "log_every": f["log_every"], "warmup_steps": f["warmup_steps"],
        "precision": f["precision"], "channels_last": f["channels_last"], "compile": f["compile"],
        "loader_threads": f["loader_threads"], "eval_batch_size": f["eval_batch_size"],
        "augment": f["augment"],
    }


def launch_workers(config: dict, cfg: dict, ctx, train_store) -> None:
    """Train on the workers; the strategy (ring | ps sync | ps async) is the launcher's business.
    Checkpoints go to ``train_store`` (checkpoint.resolve); a worker that saw the run diverge
    makes the run's error ``Diverged`` (``raise_if_diverged``), not Ray Train's."""
    from orchard.api import launch

    try:
        launch(train_loop, config, cfg, ctx, name="flower", storage_path=train_store.uri)
    except Exception:
        raise_if_diverged(ctx, train_store)  # a worker raised Diverged: that, not Train's error
        raise
    raise_if_diverged(ctx, train_store)  # a worker diverged, the group Train restarted ended at once
