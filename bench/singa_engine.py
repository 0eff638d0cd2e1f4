"""SINGA layer engine vs torch, and the training architectures side by side.

    .venv/bin/python bench/singa_engine.py --epochs 20     # ~3 min on the 2-core box (lightly loaded)
    .venv/bin/python bench/singa_engine.py --quick         # ~1 min: fewer epochs and archs

[1] The mlp app's net (64-500-400-300-200-100-10 tanh) trained by the SINGA layer engine
    (explicit gradients) and the same MLP as a torch nn.Sequential trained with autograd:
    same data (scikit-learn digits), batch, SGD settings and torch threads; images/s and the ratio
    (target: engine >= 0.9x torch).
[2] The architectures (local, sync_ps, async_ps, async_ps with 50% parameter sampling, replicated,
    allreduce) training the mlp app on local Ray: images/s, time to 97% test accuracy, final
    accuracy, communication bytes per step (the paper's Fig. 12-14 in miniature).
[3] Bytes crossing bridge layers per step for data / model / hybrid partitioning of the cnn app
    over a group of 2 (Fig. 13's trade-off as traffic): counted in one process and actually sent
    between the group's two node actors, with the time per BP step both ways.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.singa.apps import load_dataset  # noqa: E402
from workloads.singa.net import NeuralNet  # noqa: E402
from workloads.singa.settings import load_app  # noqa: E402
from workloads.singa.updaters import Updater  # noqa: E402


def torch_mlp(app: dict) -> torch.nn.Sequential:
    """The mlp app's layer list as nn.Sequential (tanh hidden layers, linear output)."""
    mods, prev = [], 64
    for layer in app["layers"]:
        if layer["type"] in ("tanh_hidden", "innerproduct"):
            mods.append(torch.nn.Linear(prev, layer["num_output"]))
            if layer["type"] == "tanh_hidden":
                mods.append(torch.nn.Tanh())
            prev = layer["num_output"]
    return torch.nn.Sequential(*mods)


def engine_vs_torch(epochs: int, batch: int) -> dict:
    torch.set_num_threads(1)
    app = load_app("mlp")
    ds = load_dataset("digits", None, 0, False)
    x = torch.as_tensor(ds.train["pixel"])
    y = torch.as_tensor(ds.train["label"])
    upd = app["train"]["updater"]
    net = NeuralNet(app["layers"], ds.shapes(), seed=0)
    updater = Updater(upd)
    model = torch_mlp(app)
    opt = torch.optim.SGD(model.parameters(), lr=upd["lr"], momentum=upd["momentum"], weight_decay=upd["weight_decay"])
    steps = len(x) // batch
    rates = {"engine": [], "torch": []}
    step = 0
    for epoch in range(epochs):
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        batches = [perm[i * batch:(i + 1) * batch] for i in range(steps)]
        # interleave the two per epoch so machine noise hits both alike
        t0 = time.perf_counter()
        for idx in batches:
            net.train_bp({"pixel": x[idx], "label": y[idx]})
            updater.update(net.params, step)
            step += 1
        rates["engine"].append(steps * batch / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for idx in batches:
            # the same parser as the engine's mnist layer: x / 127.5 - 1
            out = model(x[idx].float() / 127.5 - 1.0)
            loss = torch.nn.functional.cross_entropy(out, y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        rates["torch"].append(steps * batch / (time.perf_counter() - t0))
    tx, ty = torch.as_tensor(ds.test["pixel"]), torch.as_tensor(ds.test["label"])
    with torch.no_grad():
        torch_acc = float((model(tx.float() / 127.5 - 1.0).argmax(1) == ty).float().mean())
    engine_acc = net.forward({"pixel": tx, "label": ty}, "test")["loss/accuracy"]
    eng, tor = statistics.median(rates["engine"]), statistics.median(rates["torch"])
    # the median of per-epoch ratios: each pair ran back to back, so load changes cancel
    ratio = statistics.median(e / t for e, t in zip(rates["engine"], rates["torch"]))
    return {"engine_images_per_s": eng, "torch_images_per_s": tor, "ratio": ratio,
            "engine_test_accuracy": engine_acc, "torch_test_accuracy": torch_acc}


# row -> (preset in conf/singa/arch/, overrides): the presets as the CLI runs them, 2 groups
ARCHS = {
    "local": ("local", {}),
    "sync_ps": ("sync_ps", {"worker_groups": 2, "servers_per_group": 1}),
    "async_ps": ("async_ps", {"worker_groups": 2, "servers_per_group": 1}),
    "async_ps+sample0.5": ("async_ps", {"worker_groups": 2, "servers_per_group": 2, "sample_ratio": 0.5}),
    "replicated": ("replicated", {"worker_groups": 2}),
    "allreduce": ("allreduce", {"worker_groups": 2}),
}


def preset(name: str) -> dict:
    import yaml

    from workloads.singa.settings import singa_conf_dir

    arch, overrides = ARCHS[name]
    return {**yaml.safe_load((singa_conf_dir() / "arch" / f"{arch}.yaml").read_text()), **overrides}


def architectures(epochs: int, names: list[str], target: float = 0.97) -> list[dict]:
    from workloads.singa.architectures import Architecture

    app = load_app("mlp")
    rows = []
    for name in names:
        arch = preset(name)
        spec = {"layers": app["layers"], "algorithm": "bp", "data": "digits", "data_dir": None, "seed": 0,
                "smoke": False, "batch_size": app["train"]["batch_size"], "updater": app["train"]["updater"],
                "augment": app["train"]["augment"], "shuffle": True, "group_size": 1, "partition": "none",
                "threads": 1}
        machine = Architecture(arch, spec, cpus_per_group=2.0 / arch["worker_groups"] - 0.01)
        train_s, reached, reached_epoch, best, acc = 0.0, None, None, 0.0, 0.0
        try:
            for epoch in range(1, epochs + 1):
                t0 = time.perf_counter()
                done = 0
                while done < machine.steps_per_epoch:
                    n = min(machine.round_length(), machine.steps_per_epoch - done)
                    machine.run_steps(n)
                    done += n
                train_s += time.perf_counter() - t0
                acc = machine.evaluate()["loss/accuracy"]
                best = max(best, acc)
                if reached is None and acc >= target:
                    reached, reached_epoch = train_s, epoch
            stats = machine.stats()
        finally:
            machine.shutdown()
        images = stats["steps"] * spec["batch_size"] * arch["worker_groups"]
        rows.append({"arch": name, "images_per_s": images / train_s, "time_to_target_s": reached,
                     "test_accuracy": acc, "comm_bytes_per_step": stats["comm_bytes_per_step"]})
        when = f"{reached:.1f} s (epoch {reached_epoch})" if reached else "not reached"
        print(f"  {name:20s} {rows[-1]['images_per_s']:9.0f} img/s  to {target:.0%}: {when:>18}  "
              f"acc {acc:.4f} (best {best:.4f})  "
              f"{stats['comm_bytes_per_step'] / 1e6:7.2f} MB/step", flush=True)
    return rows


def partition_traffic(steps: int = 5) -> dict:
    """Per scheme: bridge bytes per BP step counted in one process, the bytes the group's node
    actors really sent per step, and ms per step both ways."""
    from workloads.singa.group_nodes import NodeGroup
    from workloads.singa.partition import partition_net

    app = load_app("cnn")
    shapes = {"image": (3, 32, 32), "label": ()}
    g = torch.Generator().manual_seed(0)
    batch = {"image": torch.randint(0, 256, (100, 3, 32, 32), generator=g, dtype=torch.uint8),
             "label": torch.randint(0, 10, (100,), generator=g)}
    out = {}
    for scheme in ("data", "model", "hybrid"):
        net = partition_net(NeuralNet(app["layers"], shapes, seed=0), 2, scheme, 100)
        net.train_bp(batch)
        counted = net.bridge_bytes()
        t0 = time.perf_counter()
        for _ in range(steps):
            net.train_bp(batch)
        one_process_ms = (time.perf_counter() - t0) / steps * 1e3
        recipe = {"layers": app["layers"], "input_shapes": shapes, "seed": 0, "group_size": 2, "plan": net.plan}
        nodes = NodeGroup(net, recipe)
        try:
            nodes.run("bp", batch)  # warm-up
            sent0 = nodes.bridge_bytes
            t0 = time.perf_counter()
            for _ in range(steps):
                nodes.run("bp", batch)
            actors_ms = (time.perf_counter() - t0) / steps * 1e3
            sent = (nodes.bridge_bytes - sent0) / steps
        finally:
            nodes.close()
        out[scheme] = {"bridge_bytes_per_step": counted, "sent_bytes_per_step": sent,
                       "one_process_ms": one_process_ms, "actors_ms": actors_ms,
                       "plan": {k: v for k, v in net.describe_plan().items() if v != "whole"}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 engine epochs, 12 arch epochs, 3 archs")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per architecture (default 30)")
    args = ap.parse_args()
    print("[1] layer engine vs torch nn.Sequential + autograd (mlp app, digits, batch 64, 1 thread)")
    r = engine_vs_torch(3 if args.quick else 8, 64)
    print(f"  engine {r['engine_images_per_s']:9.0f} img/s   torch {r['torch_images_per_s']:9.0f} img/s   "
          f"ratio engine/torch = {r['ratio']:.2f}x   (test acc after the same steps: engine "
          f"{r['engine_test_accuracy']:.4f}, torch {r['torch_test_accuracy']:.4f})", flush=True)
    epochs = args.epochs or (12 if args.quick else 30)
    names = ["local", "sync_ps", "allreduce"] if args.quick else list(ARCHS)
    print(f"[2] architectures, mlp app, {epochs} epochs, 2 worker groups (local: 1), Ray on 2 CPUs")
    import ray

    from orchard import cluster

    cluster.prepare_local_env()  # Ray workers import workloads/ from this checkout
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    architectures(epochs, names)
    print("[3] cnn app over a worker group of 2 (batch 100): bridge bytes per BP step counted in one process "
          "and sent between the 2 node actors; ms per step")
    for scheme, row in partition_traffic().items():
        print(f"  {scheme:7s} counted {row['bridge_bytes_per_step'] / 1e6:6.2f} MB/step  sent by actors "
              f"{row['sent_bytes_per_step'] / 1e6:6.2f} MB/step   one process {row['one_process_ms']:6.1f} ms  "
              f"node actors {row['actors_ms']:6.1f} ms   "
              f"plan {row['plan'] if scheme == 'hybrid' else '(all ' + scheme + ')'}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
