"""cluster.ray_log_level: Ray's INFO chatter leaves the console, warnings stay."""
import logging

import pytest

from orchard.cluster import ray_logging


def _emit(name, level, message):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger(name)
    handler = Keep()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        logger.log(level, message)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return records


def test_filters_drop_train_chatter_and_state_api_nagging_but_keep_warnings(monkeypatch):
    monkeypatch.setenv(ray_logging.LEVEL_ENV, "WARNING")
    ray_logging.install_filters()
    ray_logging.install_filters()  # idempotent: a second hook call adds nothing
    reporter = ray_logging._chatty_loggers()[-1]
    assert reporter.endswith("context.py")
    assert len(logging.getLogger(reporter).filters) == 1
    assert _emit(reporter, logging.INFO, "Reporting training result 1") == []
    assert _emit("ray.train.torch.config", logging.INFO, "Setting up process group") == []
    assert _emit("ray.train.torch.config", logging.WARNING, "gloo timeout") == ["gloo timeout"]
    nag = "Failed to query Ray Train Controller actor state. State API may be temporarily unavailable."
    assert _emit(ray_logging.PG_CLEANER, logging.WARNING, nag) == []
    assert _emit(ray_logging.PG_CLEANER, logging.WARNING, "cleanup failed") == ["cleanup failed"]


def test_runtime_env_carries_the_hook_only_where_orchard_is_importable(monkeypatch):
    monkeypatch.delenv("RAY_DATA_LOGGING_CONFIG", raising=False)
    monkeypatch.delenv(ray_logging.LEVEL_ENV, raising=False)
    local = ray_logging.quiet("warning", {"env_vars": {"A": "1"}}, "local")
    assert local["worker_process_setup_hook"] == ray_logging.SETUP_HOOK
    assert local["env_vars"]["A"] == "1" and local["env_vars"][ray_logging.LEVEL_ENV] == "WARNING"
    assert local["env_vars"]["RAY_DATA_LOGGING_CONFIG"] == str(ray_logging.RAY_DATA_LOGGING)
    assert ray_logging.RAY_DATA_LOGGING.exists()
    shipped = ray_logging.quiet("WARNING", {}, "shipped")
    assert shipped["env_vars"]["RAY_DATA_LOGGING_CONFIG"] == "orchard/cluster/ray_data_logging.yaml"
    modules = ray_logging.quiet("WARNING", {}, "modules")   # Ray Client: no checkout path on the workers
    assert modules["worker_process_setup_hook"] == ray_logging.SETUP_HOOK
    assert "RAY_DATA_LOGGING_CONFIG" not in modules["env_vars"]
    foreign = ray_logging.quiet("WARNING", {"working_dir": "/theirs"}, "foreign")
    assert "worker_process_setup_hook" not in foreign and "RAY_DATA_LOGGING_CONFIG" not in foreign["env_vars"]
    verbose = ray_logging.quiet("INFO", {}, "local")
    assert "RAY_DATA_LOGGING_CONFIG" not in verbose["env_vars"]


@pytest.mark.parametrize("address,ships", [("ray://head:10001", "py_modules"), ("auto", "working_dir")])
def test_a_remote_cluster_gets_the_checkout_and_ray_client_gets_it_as_py_modules(address, ships, monkeypatch):
    """Ray Client's server on the head runs with a working_dir copy as its current directory,
    where torch's oneMKL aborts it if the copy goes (docs/cluster.md): over ray:// orchard and
    workloads travel as py_modules instead; cluster=remote with another address keeps the checkout."""
    import ray

    from orchard import cluster

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw) or {})
    monkeypatch.setattr(cluster, "_print_addresses", lambda *a: None)
    # workloads registered from outside the checkout (the tests' tiny one, once another test has
    # registered it) ship too: that is outside_packages' own test; here only orchard and workloads
    monkeypatch.setattr(cluster, "outside_packages", lambda: [])
    assert cluster.connect({"mode": "remote", "address": address})
    env = seen["runtime_env"]
    other = {"py_modules": "working_dir", "working_dir": "py_modules"}[ships]
    assert ships in env and other not in env
    if ships == "py_modules":
        assert [p.rsplit("/", 1)[-1] for p in env["py_modules"]] == ["orchard", "workloads"]
    assert env["worker_process_setup_hook"] == ray_logging.SETUP_HOOK


@pytest.mark.parametrize("address,tries", [("ray://head:10001", 2), ("auto", 1)])
def test_a_ray_client_whose_server_died_starting_connects_once_more(address, tries, monkeypatch, capsys):
    """Ray Client's proxy forks a server per client, which sometimes dies in the fork
    (ray-project/ray#63202; one CI run here): orchard connects again, once, and says so; any
    other refusal, a second failure, or another address's, is raised as Ray raised it."""
    import ray

    from orchard import cluster

    calls = []

    def init(**kw):
        calls.append(kw["address"])
        if len(calls) <= failures:
            raise ConnectionAbortedError(message)
        return {}

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(cluster, "_print_addresses", lambda *a: None)
    monkeypatch.setattr(cluster, "outside_packages", lambda: [])
    message, failures = "Initialization failure from server:\n", 1
    if tries == 2:
        assert cluster.connect({"mode": "remote", "address": address}) and calls == [address] * 2
        assert capsys.readouterr().err.count("failed to start (ray-project/ray#63202); connecting again") == 1
        calls.clear()
    failures = 2  # a second failure is raised (another address's, the first)
    with pytest.raises(ConnectionAbortedError):
        cluster.connect({"mode": "remote", "address": address})
    assert len(calls) == tries
    calls.clear()
    message, failures = "Version mismatch", 1  # nor another refusal
    with pytest.raises(ConnectionAbortedError):
        cluster.connect({"mode": "remote", "address": address})
    assert len(calls) == 1
