"""The flower model's step in plain PyTorch, one process: the peer of ``python -m bench flower_gpu``'s images/s row.

    python -m bench.flower_plain_step --device cuda --tile 224 --batch 64 --precision bf16 --channels-last

What a user writes to know what the hardware gives the model: the same ``FlowerCounterCNN``, the
same pixel-wise Euclidean loss in float32, Adam at the workload's rate, the same autocast and
memory layout as orchard's step (workloads/flower/train.py: train_step), a batch of uint8 tiles
that is already on the device and becomes float there (as orchard's loader hands it), and no
host sync inside the timed steps (the loss adds up on the device and is read once at the end).
No Ray, no loader, no MLflow: the upper bound orchard's step windows are held to (issue 49: >= 0.9x).
Prints one JSON line: ``{"images_per_s": ..., "steps": ..., "seconds": ..., "loss": ...}``.
"""
from __future__ import annotations

import argparse
import json
import time


def measure(device: str, tile: int, batch: int, precision: str, channels_last: bool, steps: int,
            warmup: int = 10, lr: float = 1e-3, seed: int = 0) -> dict:
    import torch

    from workloads.flower.model import FlowerCounterCNN, euclidean_loss
    from workloads.flower.precision import Precision, prepare_model

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device: cuda, but torch sees no CUDA GPU here; allowed: cpu (or run it on a GPU machine)")
    torch.manual_seed(seed)
    model = prepare_model(FlowerCounterCNN().to(dev), channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    prec = Precision(precision, dev)
    if prec.scaler is not None:
        raise SystemExit("--precision: fp32 or bf16 (fp16's GradScaler is orchard's ring only)")
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    images = torch.randint(0, 256, (batch, 3, tile, tile), dtype=torch.uint8, device=dev)
    target = torch.rand(batch, 1, tile, tile, device=dev) * (4.0 / (tile * tile))  # a few flowers a tile
    loss_sum = torch.zeros((), device=dev)

    def step() -> None:
        x = images.to(memory_format=fmt).float().div_(255.0)
        with prec.autocast():
            predicted = model(x)
        loss = euclidean_loss(predicted.float(), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum.add_(loss.detach())

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):  # cuDNN's algorithm search and the allocator's first blocks, untimed
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = time.perf_counter() - t0
    return {"images_per_s": steps * batch / seconds, "steps": steps, "seconds": seconds,
            "loss": float(loss_sum) / (warmup + steps)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.flower_plain_step", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tile", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    a = ap.parse_args(argv)
    print(json.dumps(measure(a.device, a.tile, a.batch, a.precision, a.channels_last, a.steps, a.warmup, a.lr)))


if __name__ == "__main__":
    main()
