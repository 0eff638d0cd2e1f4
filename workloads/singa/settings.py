"""From the composed config to the plain dicts the driver and the worker groups use: the app
file (conf/singa/apps/<app>.yaml), the arch preset (conf/singa/arch/<arch>.yaml) and the
``singa.*`` overrides, merged in that order (a non-null ``singa.*`` key wins)."""
from __future__ import annotations

from pathlib import Path

import yaml

APPS = ("mlp", "cnn", "rbm", "dbn", "msae")


def singa_conf_dir() -> Path:
    from orchard.config import conf_dir

    return conf_dir() / "singa"


def load_app(name: str) -> dict:
    """An app's YAML (net layers, data, training defaults) as a plain dict."""
    path = singa_conf_dir() / "apps" / f"{name}.yaml"
    return yaml.safe_load(path.read_text())


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
        "seed": int(cfg.get("seed", 0)),
        "smoke": bool(cfg.get("smoke", False)),
        "batch_size": int(train["batch_size"]),
        "updater": train["updater"],
        "augment": train.get("augment"),
        "shuffle": bool(train.get("shuffle", True)),
        "group_size": int(arch.get("workers_per_group", 1)),
        "partition": s.get("partition", "none"),
        "threads": int(s.get("threads", 1)),
    }
