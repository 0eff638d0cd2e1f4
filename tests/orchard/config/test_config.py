"""Config composition and validation: every workload x strategy composes; bad input fails
before Ray starts with one line naming the key, exit code 2."""
import subprocess
import sys
from pathlib import Path

import pytest

from orchard import ConfigError
from orchard.cli import main
from orchard.config import compose, flatten, registry
from orchard.run.lifecycle import prepare

REPO = Path(__file__).resolve().parents[3]
SHIPPED = ["flower", "forest", "singa", "video"]


def _pairs():
    for name in SHIPPED:
        module = registry.load(name)
        for strategy in module.STRATEGIES:
            yield name, strategy


@pytest.mark.parametrize("workload,strategy", list(_pairs()))
def test_every_workload_strategy_pair_composes_and_validates(workload, strategy):
    cfg, module = prepare([f"workload={workload}", f"strategy={strategy}"])
    assert cfg["workload"]["name"] == workload
    assert cfg["strategy"]["name"] == strategy
    assert workload in cfg  # the workload's own keys live under its name
    smoke, _ = prepare([f"workload={workload}", f"strategy={strategy}", "debug=smoke"])
    assert smoke["smoke"] is True


def test_workload_file_picks_its_default_strategy():
    assert compose(["workload=forest"])["strategy"]["name"] == "tasks"
    assert compose(["workload=flower"])["strategy"]["name"] == "ring"
    assert compose(["workload=flower", "strategy=ps"])["strategy"]["mode"] == "sync"


def test_config_is_plain_containers():
    cfg = compose(["workload=tiny"])
    def walk(x):
        assert type(x) in (dict, list, str, int, float, bool, type(None)), type(x)
        for v in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else []):
            walk(v)
    walk(cfg)
    assert flatten({"a": {"b": 1, "c": {"d": 2}}}) == {"a.b": 1, "a.c.d": 2}


@pytest.mark.parametrize("overrides,key,fragment", [
    (["workload=tiny", "strategy.num_workers=0"], "strategy.num_workers", "positive integer"),
    (["workload=tiny", "tiny.lrr=0.1"], "tiny.lrr", "did you mean tiny.lr"),
    (["workload=tiny", "tiny.lr=5"], "tiny.lr", "below 1.0"),
    (["workload=tiny", "tiny.data_dir=/no/such/folder"], "tiny.data_dir", "does not exist"),
    (["workload=tiny", "strategy=ps", "strategy.mode=sometimes"], "strategy.mode", "sync, async"),
    (["workload=tiny", "strategy=nope"], "strategy", "ps, ring, tasks"),
    (["workload=flower", "strategy=tasks"], "strategy.name", "ring, ps"),
    (["workload=tiny", "tracking.uri=nonsense"], "tracking.uri", "sqlite:///mlflow.db"),
    (["workload=tiny", "logs.max_mb=0"], "logs.max_mb", "positive number of MiB"),
    (["workload=tiny", "tracking.max_series_points=1"], "tracking.max_series_points", "integer >= 2"),
    (["workload=flower", "flower.lrr=0.1"], "flower.lrr", "did you mean flower.optimizer.lr?"),
    (["workload=tiny", "+seed=1"], "seed", "already exists; drop the leading '+'"),
    (["workload=tiny", "~nope"], "nope", "no such config key to delete"),
    (["workload=tiny", "experiment=nope"], "experiment", "one of "),
    (["workload=tiny", "tiny.lr=[0.1"], "tiny.lr", "Hydra's grammar"),
    (["workload=tiny", "tiny.lr=0.1,0.2"], "tiny.lr", "add --multirun"),
    (["workload=tiny", "hydra/launcher=basic"], "hydra/launcher", "sweep=<name>"),
    # the core's schema (orchard/config/schema.py) is strict: a quoted number is not a number
    (["workload=tiny", "strategy.num_workers='2'"], "strategy.num_workers", "a positive integer, got '2'"),
    (["workload=tiny", "cluster.worker_start_timeout_s=0"], "cluster.worker_start_timeout_s", "a positive number"),
])
def test_bad_config_is_one_clear_error_before_ray(overrides, key, fragment, monkeypatch, capsys):
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started for a bad config"))
    with pytest.raises(ConfigError) as err:
        prepare(overrides)
    assert err.value.key == key
    assert fragment in str(err.value)
    with pytest.raises(SystemExit) as code:
        main(overrides)
    assert code.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"orchard: bad config: {key}:")


def test_config_errors_come_from_hydras_data_not_its_wording(monkeypatch):
    """Hydra rewording every composition message changes none of orchard's lines: they come from
    the parsed overrides, the exception types and the keys OmegaConf names (orchard/config/errors.py)."""
    from hydra import errors

    cases = [["workload=tiny", "tiny.lrr=1"], ["workload=nope"], [], ["workload=tiny", "+seed=1"],
             ["workload=tiny", "~nope"], ["workload=tiny", "strategy=nope"], ["workload=tiny", "tiny.lr=abc,"]]
    before = []
    for overrides in cases:
        with pytest.raises(ConfigError) as err:
            prepare(overrides)
        before.append(str(err.value))
    for name in ("ConfigCompositionException", "MissingConfigException", "OverrideParseException"):
        monkeypatch.setattr(getattr(errors, name), "__str__", lambda self: "Hydra words this differently now")
    for overrides, line in zip(cases, before):
        with pytest.raises(ConfigError) as err:
            prepare(overrides)
        assert str(err.value) == line


def test_unknown_workload_lists_choices_and_exits_2_from_the_shell():
    proc = subprocess.run([sys.executable, "-m", "orchard", "workload=nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "workload" in proc.stderr
    for name in SHIPPED:
        assert name in proc.stderr
    assert "Ray" not in proc.stdout + proc.stderr


def test_missing_workload_is_required():
    with pytest.raises(ConfigError) as err:
        prepare([])
    assert err.value.key == "workload" and "required" in err.value.allowed


def test_help_lists_groups(capsys):
    with pytest.raises(SystemExit) as code:
        main(["--help"])
    assert code.value.code == 0
    out = capsys.readouterr().out
    assert "strategy" in out and "ring" in out and "smoke" in out


@pytest.mark.parametrize("sweep", sorted(p.stem for p in (REPO / "conf" / "sweep").glob("*.yaml")))
def test_shipped_sweeps_validate_against_their_workload(sweep):
    workload = sweep.split("_")[0]
    cfg, _ = prepare([f"workload={workload}", f"sweep={sweep}"])
    assert cfg["sweep"]["name"] == sweep


EXPERIMENTS = sorted((Path(__file__).resolve().parents[3] / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_every_shipped_experiment_composes_and_validates_and_opens_with_its_command(path):
    """conf/experiment/<name>.yaml opens with the command that runs it (right after Hydra's
    ``# @package`` header, which Hydra reads only before any other line); that command's config
    composes and passes the workload's checks (an experiment naming one that does not exist fails here)."""
    import shlex

    from orchard.config import registry
    from orchard.config import compose

    header, first = path.read_text().splitlines()[:2]
    assert header.startswith("# @package _global_"), header
    assert first.startswith("# ") and "python -m orchard " in first, first
    command = first.split("python -m orchard ", 1)[1]
    words = shlex.split(command.split("(")[0].split(" -- ")[0])
    assert f"experiment={path.stem}" in words
    cfg = compose(words)
    registry.load(cfg["workload"]["name"]).validate(cfg)
