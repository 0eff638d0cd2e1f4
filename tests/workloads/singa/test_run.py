"""singa through orchard's CLI path: config composition, validation, and end-to-end runs
against a real MLflow sqlite store."""
from __future__ import annotations

import pytest

from orchard.config import validate
from orchard.errors import ConfigError
from orchard.tracking import bookkeeping
from workloads import singa


@pytest.mark.parametrize("strategy,arch", [("ps", "sync_ps"), ("ring", "allreduce")])
def test_strategy_picks_the_default_architecture(compose, strategy, arch):
    cfg = compose("workload=singa", f"strategy={strategy}")
    assert cfg["singa"]["arch"] == arch
    validate(cfg, singa)
    assert compose("workload=singa", f"strategy={strategy}", "singa.arch=replicated")["singa"]["arch"] == "replicated"


def test_strategy_mode_picks_sync_or_async_servers(compose):
    assert compose("workload=singa", "strategy=ps", "strategy.mode=async")["singa"]["arch"] == "async_ps"
    assert compose("workload=singa", "strategy=ps", "strategy.mode=sync")["singa"]["arch"] == "sync_ps"
    cfg = compose("workload=singa", "strategy.mode=async", "strategy.async_average=true")
    validate(cfg, singa)
    from workloads.singa.settings import resolve_arch

    assert resolve_arch(cfg)["async_average"] is True


@pytest.mark.parametrize("app", ["mlp", "cnn", "rbm", "dbn", "msae"])
@pytest.mark.parametrize("arch", ["local", "sync_ps", "async_ps", "replicated", "allreduce"])
def test_every_app_and_arch_composes_and_validates(compose, app, arch):
    validate(compose("workload=singa", f"singa.app={app}", f"singa.arch={arch}", "debug=smoke"), singa)


def test_async_ps_servers_run_adagrad_like_downpour(compose):
    """Downpour as Dean et al. ran it: AdaGrad on the servers (the app's weight decay kept);
    server_updater=false puts the app's SGD back; other presets keep the app's updater."""
    from workloads.singa.architectures import server_optimizer
    from workloads.singa.settings import load_app, resolve_arch, resolve_training

    def servers(*overrides):
        cfg = compose("workload=singa", *overrides)
        validate(cfg, singa)
        updater = resolve_training(cfg, load_app("mlp"))["updater"]
        return server_optimizer(updater, resolve_arch(cfg).get("server_updater"))

    assert servers("singa.arch=async_ps") == {"name": "adagrad", "lr": 0.005, "momentum": 0.0, "weight_decay": 0.0001}
    assert servers("singa.arch=async_ps", "singa.cluster.server_updater=false")["name"] == "sgd"
    assert servers("singa.arch=sync_ps") == {"name": "sgd", "lr": 0.02, "momentum": 0.9, "weight_decay": 0.0001}


@pytest.mark.parametrize("overrides,key", [
    (["singa.app=alexnet"], "singa.app"),
    (["singa.arch=ring"], "singa.arch"),
    (["singa.partition=random"], "singa.partition"),
    (["singa.arch=sync_ps", "singa.cluster.sample_ratio=0.5"], "singa.cluster.sample_ratio"),
    (["singa.arch=replicated", "singa.cluster.server_groups=3"], "singa.cluster.server_groups"),
    (["singa.data=mnist"], "singa.data_dir"),
    (["singa.data_dir=/no/such/folder"], "singa.data_dir"),
    (["singa.updater=rmsprop"], "singa.updater"),
    (["singa.batch_size=0"], "singa.batch_size"),
    (["singa.arch=async_ps", "singa.cluster.server_updater={name:rmsprop}"], "singa.cluster.server_updater"),
    # no silent keys: what an arch would not use is rejected
    (["strategy.gpus_per_worker=1"], "strategy.gpus_per_worker"),
    (["strategy=ring", "strategy.backend=nccl"], "strategy.backend"),
    (["strategy.mode=async", "singa.arch=sync_ps"], "strategy.mode"),
    (["strategy.async_average=true"], "strategy.async_average"),
    (["singa.arch=allreduce", "singa.cluster.sync_every=2"], "singa.cluster.sync_every"),
    (["singa.arch=sync_ps", "singa.cluster.server_groups=2"], "singa.cluster.server_groups"),
    (["singa.arch=allreduce", "singa.cluster.servers_per_group=2"], "singa.cluster.servers_per_group"),
    (["singa.arch=local", "singa.cluster.server_updater={name:adagrad}"], "singa.cluster.server_updater"),
    (["singa.cluster.workers_per_group=2"], "singa.partition"),
    # rebuilds after a lost group: a count, never negative
    (["strategy=ring", "strategy.max_failures=-1"], "strategy.max_failures"),
    # local has one group: strategy.num_workers would be ignored
    (["singa.arch=local", "strategy.num_workers=2"], "strategy.num_workers"),
    # the serverless archs have no servers to separate, count or give CPUs
    (["singa.arch=local", "singa.cluster.separate_servers=false"], "singa.cluster.separate_servers"),
    (["strategy=ring", "singa.cluster.separate_servers=false"], "singa.cluster.separate_servers"),
    (["singa.arch=allreduce", "strategy.num_servers=2"], "strategy.num_servers"),
    (["singa.arch=local", "strategy.cpus_per_server=1"], "strategy.cpus_per_server"),
])
def test_bad_config_names_the_key(compose, overrides, key):
    cfg = compose("workload=singa", *overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg, singa)
    assert err.value.key == key


def test_a_typed_num_workers_that_worker_groups_would_overrule_is_refused(compose):
    """singa.cluster.worker_groups wins over strategy.num_workers: both typed and different is an
    error naming num_workers; worker_groups alone, or both equal, is fine."""
    both = ["workload=singa", "singa.arch=sync_ps", "singa.cluster.worker_groups=4", "strategy.num_workers=3"]
    for overrides, refused in ((both, True), (both[:3], False), ([*both[:3], "strategy.num_workers=4"], False)):
        cfg = compose(*overrides)
        cfg["_overrides"] = overrides  # what orchard.run.lifecycle.prepare keeps of the command line
        if refused:
            with pytest.raises(ConfigError) as err:
                validate(cfg, singa)
            assert err.value.key == "strategy.num_workers"
        else:
            validate(cfg, singa)


def test_defaults_of_the_strategy_keys_singa_reads_are_valid_for_every_arch(compose):
    """strategy.num_workers follows the arch (local: 1 group) and max_failures is 2, so a plain
    ``singa.arch=<name>`` passes the checks above that refuse ignored values."""
    for arch in ("local", "sync_ps", "async_ps", "replicated", "allreduce"):
        cfg = compose("workload=singa", f"singa.arch={arch}")
        validate(cfg, singa)
        assert cfg["strategy"]["num_workers"] == (1 if arch == "local" else 2)
        assert cfg["strategy"]["max_failures"] == 2


def test_separate_servers_decides_whether_the_servers_hold_cpus(compose, ray_session):
    from workloads.singa.settings import resolve_arch

    held = {}
    for separate in ("true", "false"):
        cfg = compose("workload=singa", "strategy.cpus_per_server=1", "strategy.num_servers=2",
                      f"singa.cluster.separate_servers={separate}")
        validate(cfg, singa)
        held[separate] = (resolve_arch(cfg)["cpus_per_server"], singa.resources(cfg).in_trial)
    # separate: 2 server actors of 1 CPU each in the run's reservation; shared: they hold none
    assert held["true"] == (1.0, ({"CPU": 1.0}, {"CPU": 1.0}))
    assert held["false"] == (0.0, ())


def _side_processes_alive() -> list:
    import psutil

    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "multiprocessing.spawn" in " ".join(child.cmdline()):
                alive.append(child)
        except psutil.Error:
            pass
    return alive


@pytest.mark.slow
def test_mlp_smoke_run_logs_the_issue_metrics(run_orchard):
    result = run_orchard("workload=singa", "debug=smoke", "singa.tsne_samples=60")
    assert result.exit_code == 0, result.outcome
    m = result.run.data.metrics
    assert m["test/accuracy"] > 0.85
    for key in ("throughput/images_per_s", "wire/bytes_per_step", "time/train_s", "test/reached_target"):
        assert key in m
    steps = {m.step for m in result.client.get_metric_history(result.run.info.run_id, "test/accuracy")}
    assert {1, 2} <= steps  # one value per epoch
    # every figure, the t-SNE ones drawn in the run's side process (ctx.side), which ended with the run
    assert {f"figures/{name}.png" for name in ("tsne_mnist", "tsne_fc1", "tsne_fc5", "learning_curves",
                                                "architectures")} <= set(result.artifacts("figures"))
    assert 0 < m["tsne/fc5_purity"] <= 1
    assert not _side_processes_alive()
    # bytes between processes sort after what a user compares: the charts open on the headline
    assert bookkeeping.chart_sections(m)[0] == "headline" and not [k for k in m if k.startswith("data/")]


@pytest.mark.slow
def test_dbn_pretrains_with_cd_then_fine_tunes(run_orchard):
    # augment=false: 2 smoke epochs on deformed digits are too few to test the hand-over by accuracy
    result = run_orchard("workload=singa", "debug=smoke", "singa.app=dbn", "singa.arch=local", "singa.tsne=false",
                         "singa.augment=false")
    assert result.exit_code == 0, result.outcome
    m = result.run.data.metrics
    assert "pretrain1/train/v1_recon_error" in m and "pretrain2/train/v2_recon_error" in m
    # held out: the test split's reconstruction error, per pre-training epoch and at the end
    assert "pretrain1/test/v1_recon_error" in m and "pretrain2/test/v2_recon_error" in m
    assert m["pretrain1/test/v1_recon_error"] != m["pretrain1/train/v1_recon_error"]
    assert "test" in result.run.data.params["singa.pretrain1/data_partition"]
    first = result.history("pretrain1/train/v1_recon_error")
    assert m["test/accuracy"] > 0.5 and first


@pytest.mark.slow
def test_cnn_and_hybrid_partition_run(run_orchard):
    result = run_orchard("workload=singa", "debug=smoke", "singa.app=cnn", "singa.arch=local", "singa.epochs=1",
                         "singa.cluster.workers_per_group=2", "singa.partition=hybrid", "singa.tsne=false")
    assert result.exit_code == 0, result.outcome
    m = result.run.data.metrics
    # the group's 2 nodes are Ray actors: bridges sent features/gradients, the group sent params
    assert "test/accuracy" in m and m["wire/bridge_bytes_per_step"] > 0 and m["wire/group_param_bytes_per_step"] > 0
    assert "tables/train_partition_plan.json" in result.artifacts("tables")
    assert "conv1:data" in result.run.data.params["singa.partition_plan"]
