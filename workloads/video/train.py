"""Two-stream training: one Ray Train run per stream for the whole training, fed by one pipeline.

Each stream trains under the ring strategy (``orchard.strategies.launch``: TorchTrainer +
DDP) with its own worker count, all streams at the same time. Its workers read their
batches from the feeder's queues (feeder.py), which deal them one streaming pipeline
(decode once, every feature) for all epochs; at each end-of-epoch mark rank 0 hands the
stream's state to the driver (which scores it on the validation segments while training
goes on) and every rank reports a checkpoint.
"""
from __future__ import annotations

import io
import time

import numpy as np

from orchard import background, divergence
from orchard.errors import Diverged


def stream_channels(feature: str, stack: int, options: dict, size: int) -> int:
    """Input channels of a stream's CNN for ``feature``."""
    from .extractors import output_shape

    return output_shape(feature, stack, size, **(options.get(feature) or {}))[0]


def train_loop(config: dict) -> None:
    """Every epoch of one stream on one Ray Train worker (the model never sees the strategy).

    A worker that sees its stream diverge (a NaN or infinite loss, or weights at an epoch's end:
    ``orchard.divergence``) hands ``{"stream", "diverged"}`` to the driver, which ends the run
    (``runner._diverged``), and returns: no checkpoint of it, and no retries of Ray Train."""
    from ray.exceptions import RayActorError

    try:
        _train(config)
    except Diverged as err:
        try:
            config["results"].put({"stream": config["stream"], "diverged": err.fields()})
        except RayActorError:
            return   # the driver already stopped the run and shut its queues down


def _train(config: dict) -> None:
    import torch
    from ray.exceptions import RayActorError
    from torch import nn

    from orchard.strategies import worker

    from .feeder import END, RESIZE, STOP
    from .model import build_stream_model

    # [1] build the model; a group Ray Train restarted resumes after its own last checkpointed
    #     epoch; else a resumed run (python -m orchard resume) starts from the driver's video
    #     checkpoint (checkpoint.py), handed over in the loop config: no file to open here
    env = worker.env(config)
    torch.manual_seed(config["seed"] + env.rank)
    model = build_stream_model(config["in_channels"], config["num_classes"], config["widths"],
                               config["dropout"])
    replica = worker.replica(model, config["optimizer"], config)
    first_epoch, step = int(config.get("first_epoch", 0)), int(config.get("first_step", 0))
    restored = worker.load_checkpoint()
    if restored is not None:
        replica.load_state_dict(restored[0])
        first_epoch = restored[1] + 1
        step = int(restored[0].get("stream_steps", step))  # per-step metrics go on from there
    elif config.get("state") is not None:
        replica.load_state_dict(torch.load(io.BytesIO(config["state"]), weights_only=True))
    stream, ctx = config["stream"], config["ctx"]
    queue, results = config["queues"][env.rank], config["results"]
    loss_fn = nn.CrossEntropyLoss()
    advice = {"key": "video.optimizer.lr", "value": float(config["optimizer"]["lr"])}

    epoch = first_epoch
    while epoch < config["epochs"]:
        replica.model.train()
        seen = correct = 0
        loss_sum = wait_s = 0.0
        t0 = time.perf_counter()
        while True:
            # [2] this worker's part of the next global batch, from the feeder's queue;
            #     the time spent waiting for it is the trainer's view of starvation
            t_wait = time.perf_counter()
            try:
                item = queue.get(block=True)
            except RayActorError:
                # the driver shut the queues down: the run was interrupted or failed there. Ending
                # here (not raising) spares Train its retries, so the driver's Ctrl-C ends at once
                return
            wait_s += time.perf_counter() - t_wait
            if isinstance(item, tuple) and item[0] in (STOP, RESIZE):
                # STOP: the run met its target, the driver already has the state it validated;
                # RESIZE: the driver relaunches this stream with another worker count from the
                # state of the epoch just finished (its checkpoint)
                return
            if isinstance(item, tuple) and item[0] == END:
                # the feeder's count of the epoch wins: a group restarted after a lost node
                # from the checkpoint before the epoch its queue is in goes on in step with it
                epoch = int(item[1])
                break
            x = torch.tensor(item["x"]).to(env.device)          # a copy: arrays from the queue are read-only
            y = torch.tensor(item["y"], dtype=torch.long).to(env.device)
            # [3] forward, backward, all-reduce (DDP), step
            logits = replica.model(x)
            loss = loss_fn(logits, y)
            replica.zero_grad()
            loss.backward()
            replica.step()
            # [4] per-stream metrics
            seen += len(y)
            correct += int((logits.argmax(1) == y).sum())
            value = loss.item()
            loss_sum += value * len(y)
            step += 1
            divergence.check({f"{stream} loss": value}, epoch=epoch + 1, step=step, **advice)
            if env.rank == 0:
                ctx.log_metrics({f"train/{stream}_loss": value}, step=step)
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
        # [5] rank 0 hands the epoch's state to the driver; every rank reports a checkpoint (of
        #     finite weights only: the last update of the epoch may have left them NaN)
        divergence.check_weights(replica.module.parameters(), epoch=epoch + 1, step=step, **advice)
        state = replica.state_dict()
        if env.rank == 0:
            ctx.log_metrics(metrics, step=epoch)
            buf = io.BytesIO()
            torch.save(state, buf)
            try:
                results.put({"stream": stream, "epoch": epoch, "state": buf.getvalue(), "metrics": metrics,
                             "steps": step})
            except RayActorError:
                return   # as above: the driver stopped the run and shut its queues down
        worker.save_checkpoint({**state, "stream_steps": step}, {**metrics, "steps": step}, epoch)
        epoch += 1


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


def launch_streams(streams: dict[str, dict], alloc: dict[str, int], queues: dict[str, list], results,
                   cfg: dict, ctx, resumed: dict | None = None, generation: int = 0) -> dict:
    """Start one Ray Train run per stream (threads on the driver); returns ``stream -> Future``.

    Each run lasts the whole training (or until a worker shift relaunches it); ``alloc[stream]``
    workers read ``queues[stream]``. ``resumed`` (checkpoint.load_checkpoint, or the driver's
    latest states when a shift relaunches a stream): every stream starts from its state there,
    at the epoch after that one. ``generation`` > 0 names a relaunched stream's Train run apart
    from the run before it (a new run, not a restart of the old one).
    """
    from orchard.strategies import launch

    vcfg = cfg["video"]

    def one(stream: str):
        spec = streams[stream]
        stream_cfg = {**cfg, "strategy": {**cfg["strategy"], "num_workers": alloc[stream]}}
        loop_config = {
            "stream": stream, "feature": spec["feature"], "in_channels": spec["in_channels"],
            "num_classes": spec["num_classes"], "widths": vcfg["widths"], "dropout": vcfg["dropout"],
            "optimizer": dict(vcfg["optimizer"]), "seed": int(cfg["seed"]), "epochs": int(vcfg["epochs"]),
            "queues": queues[stream], "results": results,
        }
        if resumed is not None:
            loop_config |= {"state": resumed["states"][stream], "first_epoch": int(resumed["epoch"]) + 1,
                            "first_step": int(resumed["steps"].get(stream, 0))}
        return launch(train_loop, loop_config, stream_cfg, ctx, name=f"{stream}-{generation}" if generation else stream)

    return {s: background.start(one, s, name=f"video-train-{s}") for s in streams}


