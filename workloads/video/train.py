"""Two-stream training from the streaming pipeline, one Ray Train worker group per stream.

Per epoch: the master draws the epoch's segment seeds; each stream gets its own
Ray Data dataset carrying only its feature; each stream trains one epoch under
the ring strategy (``orchard.strategies.launch``: TorchTrainer + DDP) with its
own worker count, both streams at the same time; the driver scores both on the
validation segments; the worker-shifting rule may move a worker between streams.
"""
from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def stream_channels(feature: str, stack: int, options: dict, size: int) -> int:
    """Input channels of a stream's CNN for ``feature``."""
    from .extractors import output_shape

    return output_shape(feature, stack, size, **(options.get(feature) or {}))[0]


def train_loop(config: dict) -> None:
    """One epoch of one stream on one Ray Train worker (the model never sees the strategy)."""
    import ray.train
    import torch
    from torch import nn

    from orchard.strategies import worker

    from .model import build_stream_model

    # [1] build the model and restore: a restarted group resumes this epoch's
    #     checkpoint, a fresh one starts from the previous epoch's state
    env = worker.env(config)
    torch.manual_seed(config["seed"] + env.rank)
    model = build_stream_model(config["in_channels"], config["num_classes"], config["widths"],
                               config["dropout"])
    replica = worker.replica(model, config["optimizer"], config)
    restored = worker.load_checkpoint()
    if restored is not None:
        replica.load_state_dict(restored[0])
    elif config["state"] is not None:
        replica.load_state_dict(torch.load(io.BytesIO(config["state"]), weights_only=True))
    feature, stream, ctx = config["feature"], config["stream"], config["ctx"]
    loss_fn = nn.CrossEntropyLoss()
    replica.model.train()

    # [2] stream this worker's shard of the epoch: only this stream's feature arrives
    shard = ray.train.get_dataset_shard("train")
    seen = correct = 0
    loss_sum = wait_s = 0.0
    t0 = time.perf_counter()
    step = config["step_offset"]
    # batch_size is the stream's global batch: shifting a worker changes the speed of a
    # stream, not its optimisation (same steps per epoch, same BatchNorm statistics count)
    per_worker = max(1, config["batch_size"] // env.world_size)
    batches = iter(shard.iter_torch_batches(batch_size=per_worker,
                                            dtypes={feature: torch.uint8, "label": torch.long}))
    while True:
        # time spent waiting for the pipeline: the trainer's view of backpressure
        t_wait = time.perf_counter()
        batch = next(batches, None)
        wait_s += time.perf_counter() - t_wait
        if batch is None:
            break
        x, y = batch[feature].to(env.device), batch["label"].to(env.device)
        # [3] forward, backward, all-reduce (DDP), step
        logits = replica.model(x)
        loss = loss_fn(logits, y)
        replica.zero_grad()
        loss.backward()
        replica.step()
        # [4] per-stream metrics
        seen += len(y)
        correct += int((logits.argmax(1) == y).sum())
        loss_sum += loss.item() * len(y)
        step += 1
        if env.rank == 0:
            ctx.log_metrics({f"train/{stream}_loss": loss.item()}, step=step)
    elapsed = time.perf_counter() - t0
    totals = torch.tensor([seen, correct, loss_sum, wait_s / max(elapsed, 1e-9)], dtype=torch.float64)
    if env.world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(totals)
    seen_all, correct_all, loss_all, wait_sum = totals.tolist()
    metrics = {f"train/{stream}_epoch_loss": loss_all / max(seen_all, 1),
               f"pipeline/{stream}_trainer_wait_fraction": wait_sum / env.world_size,
               f"train/{stream}_top1": correct_all / max(seen_all, 1),
               f"throughput/{stream}_clips_per_s": seen_all / max(elapsed, 1e-9)}
    if env.rank == 0:
        ctx.log_metrics(metrics, step=config["epoch"])
    # [5] checkpoint (rank 0 writes; every rank reports)
    worker.save_checkpoint(replica.state_dict(), {**metrics, "steps": step}, config["epoch"])


def state_from_result(result) -> tuple[bytes, int]:
    """The epoch's final state as torch-serialised bytes and the global step count."""
    import torch

    from orchard.strategies.worker import CHECKPOINT_FILE

    if result.checkpoint is None:
        raise RuntimeError(f"training produced no checkpoint: {result.error}")
    with result.checkpoint.as_directory() as folder:
        data = torch.load(Path(folder) / CHECKPOINT_FILE, weights_only=True, map_location="cpu")
    buf = io.BytesIO()
    torch.save(data["state"], buf)
    steps = int((result.metrics or {}).get("steps", 0))
    return buf.getvalue(), steps


def load_model(state: bytes, in_channels: int, num_classes: int, widths, dropout: float):
    """The eval-mode model of a stream from its state bytes."""
    import torch

    from .model import build_stream_model

    model = build_stream_model(in_channels, num_classes, widths, dropout)
    model.load_state_dict(torch.load(io.BytesIO(state), weights_only=True)["model"])
    return model.eval()


def predict(model, features: np.ndarray, batch: int = 256) -> np.ndarray:
    """Softmax probabilities (N, C) for uint8 features (N, C_in, H, W)."""
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(features), batch):
            out.append(torch.softmax(model(torch.as_tensor(features[i:i + batch])), 1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))


def shift_workers(alloc: dict[str, int], val_loss: dict[str, float], ratio: float,
                  min_workers: int) -> tuple[dict[str, int], str]:
    """The notes' dynamic allocation, evaluated between epochs.

    If the worst stream's validation loss exceeds the best one's by more than
    ``ratio`` (e.g. 1.2 = 20 %), the lagging stream takes one worker from the
    leading one, as long as the leader keeps ``min_workers``. Returns the new
    allocation and a one-line reason.
    """
    worst = max(val_loss, key=val_loss.get)
    best = min(val_loss, key=val_loss.get)
    if worst == best or val_loss[worst] <= ratio * val_loss[best]:
        return dict(alloc), "balanced: no shift"
    if alloc[best] - 1 < min_workers:
        return dict(alloc), f"{worst} lags but {best} is at its minimum"
    new = dict(alloc)
    new[best] -= 1
    new[worst] += 1
    return new, f"{worst} lags ({val_loss[worst]:.3f} vs {val_loss[best]:.3f}): one worker from {best}"


def fit_streams(streams: dict[str, dict], alloc: dict[str, int], datasets: dict, states: dict,
                steps: dict, epoch: int, cfg: dict, ctx, concurrent: bool) -> dict[str, tuple[bytes, int]]:
    """Train every stream for one epoch with ``alloc[stream]`` workers; returns new states."""
    from orchard.strategies import launch

    vcfg = cfg["video"]

    def one(stream: str):
        spec = streams[stream]
        stream_cfg = {**cfg, "strategy": {**cfg["strategy"], "num_workers": alloc[stream]}}
        loop_config = {
            "stream": stream, "feature": spec["feature"], "in_channels": spec["in_channels"],
            "num_classes": spec["num_classes"], "widths": vcfg["widths"], "dropout": vcfg["dropout"],
            "optimizer": dict(vcfg["optimizer"]), "batch_size": int(vcfg["batch_size"]),
            "seed": int(cfg["seed"]), "epoch": epoch, "state": states.get(stream),
            "step_offset": steps.get(stream, 0),
        }
        result = launch(train_loop, loop_config, stream_cfg, ctx, name=f"{stream}_epoch{epoch}",
                        datasets={"train": datasets[stream]})
        return state_from_result(result)

    if concurrent and len(streams) > 1:
        with ThreadPoolExecutor(len(streams)) as pool:
            futures = {s: pool.submit(one, s) for s in streams}
            return {s: f.result() for s, f in futures.items()}
    return {s: one(s) for s in streams}
