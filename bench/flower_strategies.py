"""Flower CNN throughput: plain PyTorch DDP (torch.multiprocessing + gloo, no Ray) next to
orchard ring, ps-sync and ps-async, on the same model, per-worker batch and tiles.

    python bench/flower_strategies.py --epochs 2         # 1 and 2 workers, ~3.5 min on 2 idle cores
    python bench/flower_strategies.py --workers 1 2 4 --epochs 3 --tile-size 224   # a bigger machine

Prints, per strategy and worker count, the mean per-step throughput (images/s summed over the
workers, first step left out: the thesis's Table 5.2 figure), images/s over the whole training
loop (images / slowest worker's loop time, start-up included), and both as a ratio to plain DDP.
Targets from the issue: ring >= 0.95x plain DDP; ps-sync >= 0.8x ring at 2 workers.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_worker(rank: int, world: int, port: int, setup: dict, out_dir: str) -> None:
    """One plain-DDP process: the same shard, batches, model, loss and Adam as orchard's loop."""
    import torch
    import torch.distributed as dist

    from workloads.flower.data import TileSet
    from workloads.flower.model import FlowerCounterCNN, euclidean_loss
    from workloads.flower.train import prefetched_batches

    started = time.time()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tiles = TileSet(setup["cache"])
    order = np.random.default_rng(setup["seed"]).permutation(np.asarray(setup["train_idx"]))
    per = len(order) // world
    shard = order[rank * per:(rank + 1) * per]
    torch.manual_seed(setup["seed"])
    model = torch.nn.parallel.DistributedDataParallel(FlowerCounterCNN())
    opt = torch.optim.Adam(model.parameters(), lr=setup["lr"])
    series = []
    for epoch in range(setup["epochs"]):
        shuffled = np.random.default_rng((setup["seed"], epoch, rank)).permutation(shard)
        tick = time.perf_counter()
        for x, target in prefetched_batches(tiles, shuffled, setup["batch_size"], setup["prefetch"],
                                            setup["sigma"], setup["density_scale"]):
            loss = euclidean_loss(model(x), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            now = time.perf_counter()
            series.append(len(x) / (now - tick))
            tick = now
    dist.barrier()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"throughput": series, "completion_s": time.time() - started}))
    dist.destroy_process_group()


def summarize(files: list[Path], batch: int) -> tuple[float, float]:
    """(mean per-step images/s summed over workers without step 0, images / slowest loop time)."""
    runs = [json.loads(p.read_text()) for p in files]
    length = min(len(r["throughput"]) for r in runs)
    total = np.sum([r["throughput"][:length] for r in runs], axis=0)
    images = sum(len(r["throughput"]) for r in runs) * batch  # one entry per step of `batch` images
    return float(np.mean(total[1:])), images / max(r["completion_s"] for r in runs)


def run_plain_ddp(world: int, setup: dict, batch: int) -> tuple[float, float]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(ddp_worker, args=(world, free_port(), setup, out), nprocs=world, join=True)
        return summarize(sorted(Path(out).glob("rank*.json")), batch)


def run_orchard(overrides: list[str]) -> dict:
    from orchard.lifecycle import execute, prepare

    cfg, module = prepare(overrides)
    outcome = execute(cfg, module)
    if outcome.exit_code != 0:
        raise RuntimeError(f"orchard run failed: {overrides}")
    return outcome.metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--tile-size", type=int, default=64)
    parser.add_argument("--images", type=int, default=4, help="synthetic 1280x720 field images to tile")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", default=None, help="folder for data, runs and the MLflow store (default: a temp dir)")
    args = parser.parse_args()

    from orchard.config import compose
    from workloads.flower.data import TileSet, bin_sample, prepare_tiles
    from workloads.flower.driver import synthetic_data

    out = Path(args.out or tempfile.mkdtemp(prefix="flower_bench_"))
    common = [f"flower.tile_size={args.tile_size}", f"flower.synthetic.num_images={args.images}",
              f"flower.epochs={args.epochs}", f"flower.batch_size={args.batch_size}", "flower.profile_every=0",
              "flower.baseline.calibration_tiles=8", "flower.baseline.cutoffs=[0.8]", "flower.baseline.thresholds=[0.01]",
              "flower.num_figures=2", f"output_dir={out}", f"tracking.uri=sqlite:///{out}/mlflow.db",
              f"tracking.artifact_location={out}/artifacts", "tracking.system_metrics=false"]
    cfg = compose(["workload=flower", *common])
    f = cfg["flower"]
    # The exact tiles orchard trains on: its synthetic-field cache, tiled without Ray.
    data_dir = synthetic_data(cfg)
    cache_root = data_dir / f"tiles-{f['tile_size']}"
    if not (cache_root / "tiles" / "index.csv").exists():
        prepare_tiles(data_dir, cache_root, f["tile_size"], f["roi"], parallel=False)
    tiles = TileSet(cache_root / "tiles")
    train_idx, _, _ = bin_sample(tiles.counts, f["bins"], f["train_fraction"], cfg["seed"])
    setup = {"cache": str(cache_root / "tiles"), "train_idx": train_idx.tolist(), "seed": cfg["seed"],
             "epochs": f["epochs"], "batch_size": f["batch_size"], "prefetch": f["prefetch"], "sigma": f["sigma"],
             "density_scale": f["density_scale"], "lr": f["optimizer"]["lr"]}
    print(f"{len(train_idx)} training tiles of {f['tile_size']} px, batch {f['batch_size']} per worker, "
          f"{f['epochs']} epochs, {os.cpu_count()} CPUs", flush=True)

    rows = []
    for world in args.workers:
        step, run = run_plain_ddp(world, setup, f["batch_size"])
        rows.append(("plain DDP", world, step, run))
        print(f"plain DDP x{world}: {step:.1f} images/s per step", flush=True)
        for label, extra in (("orchard ring", ["strategy=ring"]),
                             ("orchard ps-sync", ["strategy=ps", "strategy.mode=sync"]),
                             ("orchard ps-async", ["strategy=ps", "strategy.mode=async"])):
            m = run_orchard(["workload=flower", *extra, f"strategy.num_workers={world}", *common])
            images = len(train_idx) // world // f["batch_size"] * f["batch_size"] * world * f["epochs"]
            rows.append((label, world, m["throughput/mean_images_per_s"], images / m["time/completion_s"]))
            print(f"{label} x{world}: {rows[-1][2]:.1f} images/s per step", flush=True)

    print()
    print(f"{'strategy':<18}{'workers':>8}{'step img/s':>12}{'x DDP':>8}{'run img/s':>11}{'x DDP':>8}")
    for label, world, step, run in rows:
        base = next(r for r in rows if r[0] == "plain DDP" and r[1] == world)
        print(f"{label:<18}{world:>8}{step:>12.1f}{step / base[2]:>8.2f}{run:>11.1f}{run / base[3]:>8.2f}")
    for world in args.workers:
        ring = next(r for r in rows if r[0] == "orchard ring" and r[1] == world)
        ps = next(r for r in rows if r[0] == "orchard ps-sync" and r[1] == world)
        print(f"ps-sync / ring at {world} workers: {ps[2] / ring[2]:.2f} (per step)")


if __name__ == "__main__":
    main()
