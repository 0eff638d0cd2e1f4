"""Secrets stay secret: one rule (orchard/config/redact.py) for every writer, checked on the rule, on the
error paths, and on one real run whose command carries a marker in every place a user may put a
secret (its store, run folder, .hydra/, logs, artifacts and console grepped for them)."""
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from orchard.config import redact

MARK = "MARKER-s3cr3t-7f1"
# Under runtime_env every value is masked, whatever its name (the names a name rule missed).
PLANTED_ENV = {"GITHUB_PAT": f"{MARK}a", "WANDB_AUTH": f"{MARK}b", "PASSPHRASE": f"{MARK}c",
               "SLACK_WEBHOOK": f"https://hooks.slack.com/services/T0/B0/{MARK}d",
               "GIT_URL": f"https://{MARK}e@github.com/org/repo.git", "SENTRY_DSN": f"https://{MARK}f@o1.ingest.sentry.io/1"}


@pytest.mark.parametrize("given, recorded", [
    *[(f"+cluster.runtime_env.env_vars.{k}={v}", f"+cluster.runtime_env.env_vars.{k}=***") for k, v in PLANTED_ENV.items()],
    (f'+cluster.runtime_env.env_vars.HF_TOKEN="{MARK} tail, {MARK}"', "+cluster.runtime_env.env_vars.HF_TOKEN=***"),
    (f'cluster.runtime_env.env_vars={{AWS_SECRET_ACCESS_KEY: "{MARK}, x", OMP_NUM_THREADS: 2}}',
     "cluster.runtime_env.env_vars=***"),
    (f"cluster.runtime_env.pip=[git+https://{MARK}@github.com/org/pkg]", "cluster.runtime_env.pip=***"),
    (f"cluster={{runtime_env: {{env_vars: {{X: {MARK}}}}}}}", "cluster=***"),  # the section named inside a value
    (f"db={{host: h, password: '{MARK} y'}}", "db=***"),
    (f"storage.uri=s3://AKIA:{MARK}@bucket/prefix", "storage.uri=s3://AKIA:***@bucket/prefix"),
    (f"tracking.uri=https://{MARK}@mlflow.team/", "tracking.uri=https://***@mlflow.team/"),  # userinfo without a colon
    (f"tracking.uri=postgresql://alice:p@ss{MARK}@db.internal/mlflow", "tracking.uri=postgresql://alice:***@db.internal/mlflow"),
    (f"storage.uri=s3://b/p?region=eu-west-1&secret_key={MARK}", "storage.uri=s3://b/p?region=eu-west-1&secret_key=***"),
    ("flower.optimizer.lr=0.01", "flower.optimizer.lr=0.01"),
    ("flower.optimizer={name: sgd, lr: 0.1}", "flower.optimizer={name: sgd, lr: 0.1}"),
])
def test_one_rule_masks_each_form_and_nothing_else(given, recorded):
    assert redact.override(given) == recorded


def test_a_config_is_masked_in_a_copy_the_run_keeps_the_real_values():
    cfg = {"cluster": {"runtime_env": {"env_vars": {**PLANTED_ENV, "EMPTY": ""}, "pip": [f"git+https://{MARK}@gh/x"]}},
           "tracking": {"uri": f"mysql://u:{MARK}@h/db"}, "db": {"password": MARK}, "lr": 0.1,
           "note": f"see https://h/x?token={MARK}&workflowType=machine_learning"}
    shown = redact.config(cfg)
    assert MARK not in repr(shown)
    assert sorted(shown["cluster"]["runtime_env"]["env_vars"]) == sorted([*PLANTED_ENV, "EMPTY"])  # names stay
    assert shown["cluster"]["runtime_env"]["env_vars"]["EMPTY"] == "" and shown["lr"] == 0.1
    assert shown["note"].endswith("token=***&workflowType=machine_learning")  # orchard's own link still works
    assert cfg["db"]["password"] == MARK  # the original is untouched


def test_every_console_line_and_error_path_masks_uris(tracking_uri, tracking_dir, tmp_path, capsys):
    """``say`` (every resume/cli line, the summary's ``python -m orchard ui ... tracking.uri=``), a config
    error on the command line, and a failed run's ``orchard.error`` tag and ``error.txt``."""
    from mlflow.tracking import MlflowClient

    from orchard import cli

    from orchard.tracking import summary
    from orchard.terminal.console import say
    from orchard.tracking import mlflow_run

    say(*summary.view_lines(f"postgresql://bob:{MARK}@db/mlflow", "1", "r"), file=None)
    with pytest.raises(SystemExit) as ended:  # bad config: a path orchard cannot find, quoted back
        cli.main(["workload=forest", f"forest.data_dir=/nonexistent/https://{MARK}@host/x"])
    assert ended.value.code == 2
    console = capsys.readouterr()
    assert "python -m orchard ui r tracking.uri=postgresql://bob:***@db/mlflow" in console.out
    assert "forest.data_dir" in console.err and MARK not in console.out + console.err

    client = MlflowClient(tracking_uri)
    run = client.create_run(mlflow_run.ensure_experiment(client, "redact", f"{tracking_dir}/artifacts")).info.run_id
    mlflow_run.close_run(mlflow_run.TrackedRun(run, "0", tracking_uri), "FAILED", OSError(f"s3://user:{MARK}@bucket/x: denied"))
    assert client.get_run(run).data.tags["orchard.error"] == "OSError: s3://user:***@bucket/x: denied"
    error_txt = Path(client.download_artifacts(run, "error.txt", str(tmp_path))).read_text()
    assert "s3://user:***@bucket" in error_txt and MARK not in error_txt


@pytest.mark.slow
def test_a_secret_anywhere_on_the_command_line_reaches_no_store_file_log_or_console(tmp_path):
    """The one real process: its console and its log are only a process's. Markers in runtime_env
    (the six names, a quoted value with spaces and commas), a URI's user-info without a password
    and a query string; what the run writes is its owner's alone (0700 folders, a 0600 store)."""
    from tests.tiny_workload.cli import tiny_cli, tiny_cli_env

    env_vars = [f"+cluster.runtime_env.env_vars.{k}={v}" for k, v in PLANTED_ENV.items()]
    done = subprocess.run(tiny_cli("workload=tiny", "tiny.steps=3", *env_vars,
                                   f'+cluster.runtime_env.env_vars.HF_TOKEN="{MARK}1 tail, {MARK}2"',
                                   f"+tiny.repo=https://{MARK}3@github.com/org/r.git",
                                   f'+tiny.hook="https://hooks.example.com/x?sig={MARK}4"',
                                   f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifact_location={tmp_path}/art",
                                   f"output_dir={tmp_path}/out"),
                          cwd=tmp_path, env=tiny_cli_env(), capture_output=True, text=True, timeout=600)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    assert MARK not in console
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "orchard.log" for p in written) and any(p.parent.name == ".hydra" for p in written)
    leaked = [str(p) for p in written if MARK.encode() in p.read_bytes()]
    assert leaked == []  # the store (params, tags), the artifacts, .hydra/, the logs
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    run_dir = next((tmp_path / "out" / "tiny").iterdir())
    assert [mode(p) for p in (run_dir, tmp_path / "out" / "logs", tmp_path / "art")] == [0o700] * 3
    assert mode(tmp_path / "mlflow.db") == 0o600
    overrides = yaml.safe_load(next(p for p in written if p.name == "overrides.yaml").read_text())
    assert "+cluster.runtime_env.env_vars.GITHUB_PAT=***" in overrides  # the name stays, the value goes


