"""SINGA layer engine vs torch, and the training architectures side by side.

    python -m bench singa          # ~12 min on 2 idle cores (3 repeats)

[1] The mlp app's net (64-500-400-300-200-100-10 tanh) trained by the SINGA layer engine
    (explicit gradients) and the same MLP as a torch nn.Sequential trained with autograd. Fair:
    the same data (scikit-learn digits), the same batches in the same order, the same SGD (lr,
    momentum, weight decay), 1 torch thread each, epochs alternating engine/torch so a change of
    load hits both; torch is used the way its docs train a module (autograd + optim.SGD). The
    value per repeat is the median over epochs. Quality: test accuracy after the same steps.
    Target: engine >= 0.9x torch.
[2] The architectures (sync_ps, async_ps, async_ps with 50% parameter sampling, replicated,
    allreduce, with 2 worker groups as conf/singa/arch/*.yaml define them) training the mlp app on
    local Ray against `local` (1 group) on the same data, epochs and batch per group: the ratio is
    the 1 -> 2 group speed-up in images/s (Fig. 12 in miniature; ideal 2.0x, on a 2-core machine
    the groups share the cores with the servers). Quality: test accuracy, time to 97%, bytes per step.
[3] The cnn app over a worker group of 2 (batch 100) partitioned by data, model or hybrid: ms per
    BP step with the two halves as Ray actors against the same partitioned net in one process,
    and the bridge bytes really sent between the actors against the bytes counted in one process
    (they must be equal: output equality of the partitioning).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.singa.data import load_dataset
from workloads.singa.model import NeuralNet
from workloads.singa.settings import load_app
from workloads.singa.updaters import Updater


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


def architectures(epochs: int, names: list[str], target: float = 0.97) -> dict[str, dict]:
    """Per architecture: images/s, time to `target` test accuracy, final accuracy, bytes per step."""
    from workloads.singa.architectures import Architecture

    app = load_app("mlp")
    rows = {}
    for name in names:
        arch = preset(name)
        spec = {"layers": app["layers"], "algorithm": "bp", "data": "digits", "data_dir": None, "seed": 0,
                "smoke": False, "batch_size": app["train"]["batch_size"], "updater": app["train"]["updater"],
                "augment": app["train"]["augment"], "shuffle": True, "group_size": 1, "partition": "none",
                "threads": 1}
        machine = Architecture(arch, spec, cpus_per_group=2.0 / arch["worker_groups"] - 0.01)
        train_s, reached, acc = 0.0, None, 0.0
        try:
            for _ in range(epochs):
                t0 = time.perf_counter()
                done = 0
                while done < machine.steps_per_epoch:
                    n = min(machine.round_length(), machine.steps_per_epoch - done)
                    machine.run_steps(n)
                    done += n
                train_s += time.perf_counter() - t0
                acc = machine.evaluate()["loss/accuracy"]
                if reached is None and acc >= target:
                    reached = train_s
            stats = machine.stats()
        finally:
            machine.shutdown()
        images = stats["steps"] * spec["batch_size"] * arch["worker_groups"]
        rows[name] = {"images_per_s": images / train_s, "time_to_target_s": reached, "test_accuracy": acc,
                      "comm_mb_per_step": stats["comm_bytes_per_step"] / 1e6}
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


SIZES = {"full": {"engine_epochs": 8, "arch_epochs": 20, "archs": list(ARCHS), "partition_steps": 5},
         "smoke": {"engine_epochs": 1, "arch_epochs": 1, "archs": ["local", "allreduce"], "partition_steps": 1}}
ESTIMATE = "~12 min on 2 idle cores (3 repeats)"


def measure(size: dict, repeats: int) -> list[dict]:
    import ray

    from bench.machine import start_ray
    from bench.rows import row
    from orchard import cluster

    engine, arch_runs, parts = [], [], []
    cluster.prepare_local_env()  # Ray workers import workloads/ from this checkout
    for _ in range(repeats):
        engine.append(engine_vs_torch(size["engine_epochs"], 64))
        start_ray(num_cpus=2)
        try:
            arch_runs.append(architectures(size["arch_epochs"], size["archs"]))
            parts.append(partition_traffic(size["partition_steps"]))
            print(f"  singa: repeat {len(parts)} of {repeats} done", flush=True)
        finally:
            ray.shutdown()
    last = engine[-1]
    ratios = [e["ratio"] for e in engine]
    rows = [row("mlp on digits, engine vs torch autograd (1 thread)", "images/s",
                [e["engine_images_per_s"] for e in engine], [e["torch_images_per_s"] for e in engine],
                orchard_label="SINGA layer engine", peer_label="torch nn.Sequential + autograd",
                higher_is_better=True,
                quality={"orchard": {"test acc": last["engine_test_accuracy"]},
                         "peer": {"test acc": last["torch_test_accuracy"]}},
                target={"text": "engine >= 0.9x torch", "min_ratio": 0.9},
                note=f"median of per-epoch engine/torch ratios per repeat: {', '.join(f'{r:.2f}' for r in ratios)}")]
    local = [a["local"]["images_per_s"] for a in arch_runs] if "local" in size["archs"] else None

    def arch_quality(name):
        a = arch_runs[-1][name]
        reached = a["time_to_target_s"]
        return {"test acc": a["test_accuracy"], "to 97%": f"{reached:.1f} s" if reached else "not reached",
                "MB/step": a["comm_mb_per_step"]}

    for name in size["archs"]:
        if name == "local":
            continue
        rows.append(row(f"mlp, {name}, 2 groups vs 1 (speed-up)", "images/s",
                        [a[name]["images_per_s"] for a in arch_runs], local, higher_is_better=True,
                        orchard_label=f"{name}, 2 groups", peer_label="local, 1 group (same code)",
                        quality={"orchard": arch_quality(name),
                                 "peer": arch_quality("local") if local else {}}))
    for scheme in parts[-1]:
        p = parts[-1][scheme]
        rows.append(row(f"cnn, group of 2, {scheme} partitioning: ms per BP step", "ms",
                        [r[scheme]["actors_ms"] for r in parts], [r[scheme]["one_process_ms"] for r in parts],
                        higher_is_better=False, orchard_label="2 node actors", peer_label="same net in one process",
                        quality={"orchard": {"MB sent/step": p["sent_bytes_per_step"] / 1e6},
                                 "peer": {"MB counted/step": p["bridge_bytes_per_step"] / 1e6}},
                        target={"text": "bytes sent = bytes counted",
                                "met": abs(p["sent_bytes_per_step"] - p["bridge_bytes_per_step"]) < 1}))
    return rows
