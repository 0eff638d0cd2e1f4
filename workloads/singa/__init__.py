"""workload=singa: SINGA-style layer models and training architectures.

Source: Wang et al., "SINGA: Putting Deep Learning in the Hands of Multimedia Users" (docs/papers.md),
sections 3-6 and Appendix B.  A net is a YAML list of layers (conf/singa/apps/<app>.yaml, or the user's own file
``singa.net=...`` with layer types from ``singa.layer_modules=[...]``) built on the layer contract
of ``layers/base.py``; ``singa.arch`` (conf/singa/arch/<arch>.yaml) picks how worker groups and
parameter servers share the training.  Light on import: heavy modules load in run.py (the
entry of a train run) and predict.py (mode=predict), which the core calls (orchard/config/registry.py).
"""
from __future__ import annotations

# strategy=ps: parameter-server presets (sync_ps by default); strategy=ring: allreduce.
# singa.arch is the authority; the strategy only picks its default (conf/workload_strategy/).
STRATEGIES = ("ps", "ring")
# What the run's side process imports as Ray starts, for the figures it draws beside the driver
# (figures.py: scikit-learn's t-SNE and pyplot, which the driver then never imports)
SIDE_IMPORTS = ("workloads.singa.figures", "matplotlib.pyplot", "sklearn.manifold", "sklearn.neighbors")


def validate(cfg: dict) -> None:
    """Reject bad singa.* keys with one line, before Ray starts: each key's type and range, the
    net file's shape, the arch; a strategy or cluster key the chosen arch would ignore is rejected
    too. ``check`` builds the net."""
    from orchard.api import schema, require_choice, require_path, ConfigError
    from .data import DATASETS
    from .settings import UPDATERS, arch_names, load_net, net_key, resolve_arch, resolve_training

    from .schema import Arch, Singa

    s = cfg["singa"]
    schema.check(Singa, s, "singa")  # each key's type and range (workloads/singa/schema.py)
    modules = s.get("layer_modules") or []
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        raise ConfigError("singa.layer_modules", f"a list of importable module names, e.g. [mypkg.layers], got {modules!r}")
    require_choice(cfg, "singa.arch", arch_names())  # the presets in conf/singa/arch/
    if s.get("data") is not None:  # the dataset registry (data.py)
        require_choice(cfg, "singa.data", list(DATASETS))
    require_path(cfg, "singa.data_dir", kind="dir")
    require_path(cfg, "singa.resume", kind="dir")
    try:
        app = load_net(cfg)
    except ValueError as exc:
        raise ConfigError("singa.net", str(exc)) from None
    train = resolve_training(cfg, app)
    if train["data"] not in DATASETS:
        raise ConfigError(net_key(cfg), f"data: one of {', '.join(DATASETS)}, got {train['data']!r}")
    if train["data"] in ("mnist", "cifar10", "nuswide") and not s.get("data_dir"):
        raise ConfigError("singa.data_dir", f"a folder with the {train['data']} files (singa.data={train['data']})")
    arch = resolve_arch(cfg)
    schema.check(Arch, arch, "singa.cluster")  # the preset under singa.cluster (workloads/singa/schema.py)
    if arch["name"] in ("sync_ps", "async_ps", "replicated") and int(arch["servers_per_group"]) < 1:
        raise ConfigError("singa.cluster.servers_per_group", f"a positive integer for arch {arch['name']}")
    if arch["name"] == "replicated":
        replicas = int(arch.get("server_groups") or 0)
        if replicas < 1 or replicas > arch["worker_groups"]:
            raise ConfigError("singa.cluster.server_groups",
                              f"between 1 and the {arch['worker_groups']} worker groups, got {replicas}")
    ratio = arch.get("sample_ratio", 1.0)
    if float(ratio) < 1 and arch.get("mode") != "async":
        # A sync shard waits for every group's push of a step; sampled pushes skip shards.
        raise ConfigError("singa.cluster.sample_ratio", f"1.0 unless the arch is asynchronous (async_ps), got {ratio}")
    server_updater = arch.get("server_updater")
    if server_updater:
        if not isinstance(server_updater, dict) or server_updater.get("name") not in UPDATERS:
            raise ConfigError("singa.cluster.server_updater",
                              f"false or a dict with name one of {', '.join(UPDATERS)}, got {server_updater!r}")
        if float(server_updater.get("lr", 0.01)) <= 0:
            raise ConfigError("singa.cluster.server_updater.lr", f"a positive number, got {server_updater.get('lr')!r}")
    if arch["name"] == "local" and arch["worker_groups"] != 1:
        raise ConfigError("singa.cluster.worker_groups", "1 for arch local")
    _reject_ignored_keys(cfg, arch)


def check(cfg: dict) -> None:
    """Build the net(s) on two real samples and run one BP/CD pass (settings.check_net): a broken
    net fails with one line naming its layer, while Ray starts (torch's import and the build take
    a core for 2-3 s, which Ray's start leaves over), before any run opens."""
    from orchard.api import ConfigError

    from .data import InputTooLarge
    from .model import NetError
    from .settings import check_net, net_key

    try:
        check_net(cfg)
    except ImportError as exc:
        raise ConfigError("singa.layer_modules", str(exc)) from None
    except InputTooLarge as exc:   # a file of singa.data_dir over the bound: refused before a run opens
        raise ConfigError("singa.max_input_mb", f"a bound above every input file; {exc}") from None
    except NetError as exc:
        raise ConfigError(net_key(cfg), str(exc)) from None


def _reject_ignored_keys(cfg: dict, arch: dict) -> None:
    """No silent keys: a strategy or ``singa.cluster`` value the chosen arch would not use is
    an error, not a no-op."""
    from orchard.api import ConfigError

    name, strategy, s = arch["name"], cfg["strategy"], cfg["singa"]
    serverless = name in ("local", "allreduce")
    if float(strategy.get("gpus_per_worker", 0) or 0) > 0:
        raise ConfigError("strategy.gpus_per_worker", "0 for workload=singa (its layer engine runs its worker "
                          f"groups on CPUs), got {strategy['gpus_per_worker']}")
    if strategy.get("backend", "auto") not in ("auto", "gloo"):
        raise ConfigError("strategy.backend", f"auto or gloo for workload=singa (groups all-reduce CPU tensors), "
                          f"got {strategy['backend']!r}")
    if not isinstance(strategy.get("max_failures", 0), int) or int(strategy.get("max_failures", 0)) < 0:
        # A group's peers wait on its pushes (sync servers, the gloo ring), so a lost group is
        # never restarted alone: the whole architecture is rebuilt from the last checkpoint
        # (train.fit), at most max_failures times
        raise ConfigError("strategy.max_failures", "0 or more: rebuilds of the worker groups and servers from the "
                          f"last checkpoint after one is lost (0: a lost group ends the run), got {strategy['max_failures']}")
    fixed = (s.get("fixed_groups") or {}).get(name)
    if fixed is not None and int(strategy.get("num_workers", fixed)) != int(fixed):
        raise ConfigError("strategy.num_workers", f"{fixed} for singa.arch={name} (it has {fixed} worker group; "
                          f"more: singa.arch=sync_ps, async_ps, replicated or allreduce), got {strategy['num_workers']}")
    # singa.cluster.worker_groups (SINGA's own key, or a preset's) wins over strategy.num_workers;
    # a num_workers the user typed that it would overrule is refused, not dropped
    typed = [o.split("=", 1)[1] for o in cfg.get("_overrides", []) if o.lstrip("+~").startswith("strategy.num_workers=")]
    if typed and fixed is None and int(arch["worker_groups"]) != int(strategy.get("num_workers", 0)):
        raise ConfigError("strategy.num_workers", f"the worker groups, which singa.cluster.worker_groups="
                          f"{arch['worker_groups']} already sets for this run; give one of them, got {typed[-1]}")
    if serverless and int(strategy.get("num_servers", 1) or 1) != 1:
        raise ConfigError("strategy.num_servers", f"1 for singa.arch={name} (it has no servers), "
                          f"got {strategy['num_servers']}")
    if serverless and float(strategy.get("cpus_per_server", 0) or 0) > 0:
        raise ConfigError("strategy.cpus_per_server", f"0 for singa.arch={name} (it has no servers), "
                          f"got {strategy['cpus_per_server']}")
    if strategy.get("mode") == "async" and arch.get("mode") != "async":
        raise ConfigError("strategy.mode", f"async asks for Downpour (singa.arch=async_ps); singa.arch={name} is "
                          "synchronous")
    if strategy.get("async_average") and arch.get("mode") != "async":
        raise ConfigError("strategy.async_average", f"false unless the arch is asynchronous (async_ps), got true "
                          f"with singa.arch={name}")
    every = arch.get("sync_every", 1)
    if serverless and every != 1:
        raise ConfigError("singa.cluster.sync_every", f"1 for arch {name} (it has no servers to sync with), got {every}")
    if name in ("sync_ps", "async_ps") and int(arch.get("server_groups") or 0) != 1:
        raise ConfigError("singa.cluster.server_groups", f"1 for arch {name} (several server groups: "
                          f"singa.arch=replicated), got {arch.get('server_groups')}")
    if serverless:
        for key in ("server_groups", "servers_per_group"):
            if int(arch.get(key) or 0) != 0:
                raise ConfigError(f"singa.cluster.{key}", f"0 for arch {name} (it has no servers), got {arch[key]}")
        if arch.get("server_updater"):
            raise ConfigError("singa.cluster.server_updater", f"null for arch {name} (it has no servers)")
        if arch.get("separate_servers") is False:
            raise ConfigError("singa.cluster.separate_servers", f"true for arch {name} (it has no servers)")
    if int(arch.get("workers_per_group") or 1) > 1 and s.get("partition", "none") == "none":
        raise ConfigError("singa.partition", f"data, model or hybrid when singa.cluster.workers_per_group="
                          f"{arch['workers_per_group']} (the group's nodes split the net), got 'none'")


def resources(cfg: dict):
    """What a run holds in Ray (orchard/cluster/placement.py): one ``GroupActor`` per worker group
    (``architectures.py``; placed SPREAD, so outside a sweep trial's placement group) with the CPUs
    ``train._cpus_per_group`` gives it, and the parameter servers, started by the run itself,
    where they hold CPUs (``strategy.cpus_per_server``)."""
    from orchard.api import Resources, bundles
    from .settings import resolve_arch
    from .train import _cpus_per_group

    if cfg["mode"] == "predict":  # an actor pool of 1 CPU each, as many as fit (orchard/models/__init__.py)
        return Resources(in_trial=bundles(1, 1.0))
    arch = resolve_arch(cfg)
    servers = int(arch.get("server_groups", 0) or 0) * int(arch.get("servers_per_group", 0) or 0)
    return Resources(in_trial=bundles(servers, float(arch.get("cpus_per_server", 0.0))),
                     outside=bundles(int(arch["worker_groups"]), _cpus_per_group(cfg, arch)))


def resume(cfg: dict, previous_run_dir: str) -> None:
    """``python -m orchard resume <run id>``: go on from that run's last checkpointed epoch."""
    from orchard.api import ConfigError, Storage
    from .checkpoint import CHECKPOINT_NAME

    cfg["singa"]["resume"] = str(previous_run_dir)
    # its storage (orchard/storage/), so the driver's run folder may be gone
    if not Storage.previous_run(cfg).exists(CHECKPOINT_NAME):
        raise ConfigError("singa.resume", f"a run folder holding {CHECKPOINT_NAME}; the run stopped before its "
                          f"first checkpointed epoch ({previous_run_dir})")


def headline(cfg: dict, metrics: dict) -> list[str]:
    """Test accuracy against the app's own target (conf/singa/apps/<app>.yaml)."""
    s = cfg["singa"]
    net = f"{s.get('net') or s['app']} on {s['arch']}"
    if "data/train_samples" in metrics:  # the partition of the data the accuracy was measured on
        from .settings import load_net

        net += (f", {s.get('data') or load_net(cfg).get('data')}: {metrics['data/train_samples']:,.0f} train / "
                f"{metrics['data/test_samples']:,.0f} test")
    acc = metrics["test/accuracy"]
    target = metrics.get("test/target_accuracy")
    if target is None:
        return [f"test accuracy {acc:.3f} ({net})"]
    return [f"test accuracy {acc:.3f} vs target {target:.2f} ({'met' if acc >= target else 'not met'}; {net})"]


# What the logged model's loader (predict.py) imports: pinned in its requirements (orchard/models/logged.py).
MODEL_IMPORTS = ("torch",)


def headline_metric(metrics: dict) -> tuple[str, float]:
    """Test accuracy (``headline/test_accuracy``); msae, which retrieves rather than classifies:
    its mean average precision at 50, image to text (``headline/map_at_50_img2txt``)."""
    if "test/accuracy" in metrics:
        return "test_accuracy", metrics["test/accuracy"]
    return "map_at_50_img2txt", metrics["test/map_at_50_img2txt"]


def dataset(cfg: dict) -> dict:
    """What a train run learns from, for its MLflow dataset input (orchard/tracking/datasets.py): the
    files of ``singa.data_dir``, or a dataset a package ships or a loader makes (by its settings)."""
    from .data import DATASETS
    from .settings import load_net

    s = cfg["singa"]
    data = s.get("data") or load_net(cfg).get("data")
    if s.get("data_dir"):
        return {"name": f"{data} {str(s['data_dir']).rstrip('/').rsplit('/', 1)[-1]}", "path": s["data_dir"]}
    return {"name": f"{data}{' (smoke)' if cfg.get('smoke') else ''}", "generator": DATASETS.get(data, data),
            "settings": {"data": data, "smoke": bool(cfg.get("smoke")), "seed": cfg["seed"]}}

