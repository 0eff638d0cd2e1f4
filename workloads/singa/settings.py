"""From the composed config to the plain dicts the driver and the worker groups use: the app
file (conf/singa/apps/<app>.yaml, or the user's ``singa.net`` file in the same format), the arch
preset (conf/singa/arch/<arch>.yaml) and the ``singa.*`` overrides, merged in that order (a
non-null ``singa.*`` key wins)."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

APPS = ("mlp", "cnn", "rbm", "dbn", "msae")
# updaters.py's and partition.py's names, here: the config's checks run without torch
UPDATERS = ("sgd", "adagrad", "adam")
SCHEMES = ("none", "data", "model", "hybrid")
# What a net file (an app YAML or singa.net) may hold at its top level.
NET_KEYS = ("layers", "data", "algorithm", "train", "pretrain", "tsne_layers")


def singa_conf_dir() -> Path:
    from orchard.api import conf_dir

    return conf_dir() / "singa"


def load_app(name: str) -> dict:
    """An app's YAML (net layers, data, training defaults) as a plain dict."""
    path = singa_conf_dir() / "apps" / f"{name}.yaml"
    return yaml.safe_load(path.read_text())


def load_net(cfg: dict) -> dict:
    """The net to train: the user's ``singa.net`` YAML when set, else ``singa.app``'s.  Raises
    ``ValueError`` (one line) for a file that is not a mapping with a ``layers`` list."""
    s = cfg["singa"]
    if not s.get("net"):
        return load_app(s["app"])
    path = Path(os.path.expanduser(str(s["net"])))
    try:
        net = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{str(path)!r} is not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(net, dict) or not isinstance(net.get("layers"), list):
        raise ValueError(f"{str(path)!r}: a mapping with a 'layers' list (the format of conf/singa/apps/*.yaml)")
    unknown = sorted(set(net) - set(NET_KEYS))
    if unknown:
        raise ValueError(f"{str(path)!r}: unknown top-level keys {unknown}; allowed: {', '.join(NET_KEYS)}")
    net.setdefault("data", "digits")
    return net


def net_key(cfg: dict) -> str:
    """The config key a net problem is reported under."""
    return "singa.net" if cfg["singa"].get("net") else "singa.app"


def arch_names() -> list[str]:
    return sorted(p.stem for p in (singa_conf_dir() / "arch").glob("*.yaml"))


def resolve_arch(cfg: dict) -> dict:
    """The arch preset with ``singa.cluster`` overrides and the strategy's worker/server counts."""
    s = cfg["singa"]
    arch = yaml.safe_load((singa_conf_dir() / "arch" / f"{s['arch']}.yaml").read_text())
    for key, value in (s.get("cluster") or {}).items():
        if value is not None:
            arch[key] = value
    strategy = cfg["strategy"]
    if arch.get("worker_groups") is None:
        arch["worker_groups"] = int(strategy.get("num_workers", 1))
    if arch.get("servers_per_group") is None:
        arch["servers_per_group"] = int(strategy.get("num_servers", 1) or 1)
    arch["cpus_per_server"] = float(strategy.get("cpus_per_server", 0.0)) if arch.get("separate_servers", True) else 0.0
    # strategy=ps's async_average: each asynchronous push moves the parameters 1/groups as far
    arch["async_average"] = bool(strategy.get("async_average", False))
    return arch


def resolve_training(cfg: dict, app: dict) -> dict:
    """Training settings: the app's ``train`` section under the non-null ``singa.*`` keys."""
    s = cfg["singa"]
    train = dict(app.get("train", {}))
    updater = dict(train.get("updater", {"name": "sgd", "lr": 0.01}))
    if s.get("updater"):
        updater["name"] = s["updater"]
    if s.get("lr") is not None:
        updater["lr"] = float(s["lr"])
    train["updater"] = updater
    for key in ("epochs", "batch_size", "target_accuracy"):
        if s.get(key) is not None:
            train[key] = s[key]
    if s.get("augment") is not None:
        train["augment"] = s["augment"] or None
    train["data"] = s.get("data") or app.get("data")
    if isinstance(train.get("target_accuracy"), dict):
        # a target per dataset (cnn: CIFAR-10's paper figure, and what the offline stand-in reaches)
        train["target_accuracy"] = train["target_accuracy"].get(train["data"])
    return train


def group_spec(cfg: dict, app: dict, train: dict, arch: dict, layers: list[dict] | None = None,
               algorithm: str | None = None) -> dict:
    """The plain dict a ``WorkerGroup`` is built from (crosses into Ray actors)."""
    s = cfg["singa"]
    return {
        "layers": layers if layers is not None else app["layers"],
        "algorithm": algorithm or app.get("algorithm", "bp"),
        "cd_k": int(train.get("cd_k", 1)),
        "data": train["data"],
        "data_dir": s.get("data_dir"),
        "max_input_mb": s.get("max_input_mb"),   # the most one input file may hold (data.py)
        "seed": int(cfg.get("seed", 0)),
        "smoke": bool(cfg.get("smoke", False)),
        "batch_size": int(train["batch_size"]),
        "updater": train["updater"],
        "augment": train.get("augment"),
        "shuffle": bool(train.get("shuffle", True)),
        "group_size": int(arch.get("workers_per_group", 1)),
        "partition": s.get("partition", "none"),
        "threads": int(s.get("threads", 1)),
        # the user's layer modules, imported wherever this spec builds a net (groups, nodes)
        "layer_modules": [str(m) for m in (s.get("layer_modules") or [])],
        # random parameter sampling (6.5.1): which names a group exchanges is drawn from this
        "sample_seed": int(cfg.get("seed", 0)),
        # sync_ps/async_ps: steps between pushes (replicated: sync_every is the replica exchange)
        "push_every": int(arch.get("sync_every", 1) or 1) if arch["name"] in ("sync_ps", "async_ps") else 1,
    }


_SAMPLES: dict[tuple, tuple] = {}


def check_net(cfg: dict) -> None:
    """Build every net of the run (pre-training stages, then the main net) on two real samples
    of its data and run one BP/CD pass: an unknown layer type, a missing or extra source, a
    shape mismatch or an undeclared cycle raises ``NetError`` naming the layer, before Ray
    starts.  The user's ``singa.layer_modules`` are imported here first."""
    import torch

    from .data import load_dataset
    from .layers.base import import_layer_modules
    from .model import NetError, NeuralNet

    s = cfg["singa"]
    import_layer_modules(s.get("layer_modules") or [])
    app = load_net(cfg)
    train = resolve_training(cfg, app)
    stages = [(f"pretrain[{i}]", st.get("layers"), "cd") for i, st in enumerate(app.get("pretrain") or [])]
    stages.append(("layers", app["layers"], app.get("algorithm", "bp")))
    # smoke=True: every loader's smoke mode only takes fewer samples, with the same per-sample
    # shapes, and it is what keeps this check to about a second (digits_rgb renders 7,000 images)
    key = (train["data"], s.get("data_dir"), int(cfg.get("seed", 0)), True, s.get("max_input_mb"))
    if key not in _SAMPLES:  # a sweep or a test validates many configs over the same data
        data = load_dataset(*key)
        _SAMPLES.clear()
        _SAMPLES[key] = (data.shapes(), {k: v[:2].copy() for k, v in data.train.items()})
    shapes, samples = _SAMPLES[key]
    batch = {k: torch.as_tensor(v) for k, v in samples.items()}
    for where, layers, algorithm in stages:
        try:
            net = NeuralNet(layers, shapes, seed=0)
            net.dry_run(batch, algorithm, int(train.get("cd_k", 1)))
            missing = [n for n in app.get("tsne_layers") or [] if n not in net.by_name] if where == "layers" else []
            if missing:
                raise NetError(f"tsne_layers names no such layer: {missing}")
        except NetError as exc:
            raise NetError(f"{where}: {exc}" if where != "layers" else str(exc), exc.layer) from None
