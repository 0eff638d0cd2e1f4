"""Secrets stay secret: one rule (orchard/redact.py) for every writer, checked on the rule and on
a real singa run whose command carries a marker in each form."""
import subprocess
import sys
from pathlib import Path

import pytest

from orchard import redact

MARK = "MARKER-s3cr3t-7f1"


@pytest.mark.parametrize("given, recorded", [
    (f"cluster.runtime_env.env_vars={{AWS_SECRET_ACCESS_KEY: {MARK}, OMP_NUM_THREADS: 2}}",
     "cluster.runtime_env.env_vars={AWS_SECRET_ACCESS_KEY: ***, OMP_NUM_THREADS: 2}"),
    (f"+cluster.runtime_env.env_vars.HF_TOKEN={MARK}", "+cluster.runtime_env.env_vars.HF_TOKEN=***"),
    (f"storage.uri=s3://AKIA:{MARK}@bucket/prefix", "storage.uri=s3://AKIA:***@bucket/prefix"),
    (f"tracking.uri=postgresql://me:{MARK}@db.internal/mlflow", "tracking.uri=postgresql://me:***@db.internal/mlflow"),
    ("flower.optimizer.lr=0.01", "flower.optimizer.lr=0.01"),
])
def test_one_rule_masks_each_form_and_nothing_else(given, recorded):
    assert redact.override(given) == recorded


def test_a_config_is_masked_in_a_copy_the_run_keeps_the_real_values():
    cfg = {"cluster": {"runtime_env": {"env_vars": {"AWS_ACCESS_KEY_ID": "AKIA", "LANG": "C"}}},
           "tracking": {"uri": f"mysql://u:{MARK}@h/db"}, "db": {"password": MARK}, "lr": 0.1}
    shown = redact.config(cfg)
    assert MARK not in repr(shown) and "AKIA" not in repr(shown)
    assert shown["cluster"]["runtime_env"]["env_vars"]["LANG"] == "C" and shown["lr"] == 0.1
    assert cfg["db"]["password"] == MARK  # the original is untouched


@pytest.mark.slow
def test_a_secret_on_the_command_line_reaches_no_store_file_log_or_console(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = subprocess.run([sys.executable, "-m", "orchard", "workload=singa", "singa.arch=local", "debug=smoke",
                           f"+cluster.runtime_env.env_vars={{MY_API_TOKEN: {MARK}}}", f"tracking.uri={uri}",
                           f"output_dir={tmp_path}/out"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert MARK not in done.stdout + done.stderr  # the console
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and MARK.encode() in p.read_bytes()]
    assert leaked == []  # the store (params, tags), the artifacts, .hydra/, the logs


def test_resume_takes_no_code_environment_or_secret_from_the_store():
    """What a teammate can write in a tag must not run on the resumer's machine: recorded
    overrides naming a runtime_env, Hydra, module lists or a masked secret, and recorded config
    folders, are left out (and named) unless the command line gives them again."""
    from orchard.resume import _trusted

    recorded = ["workload=singa", "debug=smoke", "cluster.runtime_env.pip=[git+https://evil/pkg]",
                "+cluster.runtime_env.env_vars.X=1", "hydra.searchpath=[file:///tmp/evil]",
                "singa.layer_modules=[evil.layers]", "storage.uri=s3://AK:***@bucket/x"]
    kept, dropped = _trusted(recorded, ["singa.layer_modules=[mine.layers]"], ["/tmp/planted-conf"])
    assert kept == ["workload=singa", "debug=smoke"]
    assert dropped == ["cluster.runtime_env.pip", "cluster.runtime_env.env_vars.X", "hydra.searchpath", "storage.uri",
                       "--config-dir /tmp/planted-conf"]


def test_ray_without_its_token_is_refused_unless_allowed(monkeypatch):
    from orchard.errors import ConfigError
    from orchard.lifecycle import _check_ray_auth

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ConfigError) as refused:
        _check_ray_auth({"mode": "local"})
    assert refused.value.key == "cluster.allow_unauthenticated"
    _check_ray_auth({"mode": "local", "allow_unauthenticated": True})  # meant: an isolated network
    monkeypatch.delenv("RAY_AUTH_MODE")
    _check_ray_auth({"mode": "local"})
