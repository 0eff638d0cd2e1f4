"""What a user sees: a quiet console that leads with the answer, and Hydra's own conventions.

The smoke runs are real CLI processes shared with the figure, model and notebook tests
(``cli_run``); the Hydra checks compose only (``--cfg``, ``--info``) or run the tiny workload.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
NOISE = ("ERROR", "Traceback", "USDT", "Warning", "WARN")
SMOKE = {
    "flower": ("workload=flower", "strategy=ring"),
    "forest": ("workload=forest",),
    "video": ("workload=video",),
    "singa": ("workload=singa", "singa.arch=local"),
}
HEADLINE = {"flower": "count MAE: CNN", "forest": "pixel accuracy", "video": "top-1: fused",
            "singa": "test accuracy"}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchard", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
@pytest.mark.parametrize("workload", list(SMOKE))
def test_a_smoke_run_prints_only_orchards_lines_with_the_headline_first(cli_run, workload):
    run = cli_run(*SMOKE[workload])
    assert run.exit_code == 0, run.console[-3000:]
    lines = run.console.splitlines()
    noisy = [line for line in lines if any(word in line for word in NOISE)]
    assert not noisy, noisy[:5]
    assert len(lines) <= 60, run.console
    # the config in one line first; the summary's title, then the workload's headline
    assert lines[0].startswith(f"orchard: workload={workload}")
    assert any(line.startswith("orchard: MLflow run ") and "view: python -m orchard ui" in line for line in lines[:3]), lines[:3]
    title = next(i for i, line in enumerate(lines) if line.startswith(f"orchard {workload}/"))
    assert HEADLINE[workload] in lines[title + 1], lines[title:title + 3]
    assert any(line.startswith("view:      python -m orchard ui") for line in lines[title:])
    # the metric count the summary gives is the one the MLflow UI shows (series and samplers too)
    counted = next(line for line in lines[title:] if line.startswith("MLflow:"))
    assert f", {len(run.run.data.metrics)} metrics," in counted, counted
    # everything else is in the run's log: in its folder and beside its metrics in MLflow
    assert (run.run_dir / "orchard.log").stat().st_size > 0
    assert "orchard.log" in run.artifacts()
    # the run folder, <output_dir>/<workload>/<run id>, holds what a @hydra.main app's holds
    assert run.run_dir.name == run.run_id and run.run_dir.parent.name == workload
    config = yaml.safe_load((run.run_dir / ".hydra" / "config.yaml").read_text())
    assert config["workload"]["name"] == workload and config["smoke"] is True
    assert "debug=smoke" in yaml.safe_load((run.run_dir / ".hydra" / "overrides.yaml").read_text())
    hydra = yaml.safe_load((run.run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert hydra["runtime"]["output_dir"] == str(run.run_dir) and hydra["mode"] == "RUN"
    assert hydra["runtime"]["choices"]["workload"] == workload and "debug=smoke" in hydra["overrides"]["task"]
    if workload == "flower":  # README's console example shows the lines a real run prints, in their order
        assert summary_labels(readme_console_example()) == summary_labels(lines), \
            "README's console example no longer matches the console: paste a fresh one"


def summary_labels(lines: list[str]) -> list[str]:
    """The labels of the summary's lines ('speed', 'time', 'view', ...), from its title on."""
    import re

    title = next(i for i, line in enumerate(lines) if re.match(r"orchard \w+/\w+: ", line))
    return [m[1] for line in lines[title + 1:] if (m := re.match(r"([a-zA-Z][a-zA-Z ]*?):\s", line))]


def readme_console_example() -> list[str]:
    text = (REPO / "README.md").read_text().split("### What the console shows", 1)[1]
    return text.split("```text\n", 1)[1].split("```", 1)[0].splitlines()


@pytest.mark.slow
def test_config_dir_adds_the_users_own_experiment(tmp_path):
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "experiment" / "quick.yaml").write_text("# @package _global_\nseed: 41\nforest:\n  num_trees: 1\n")
    for flag in (["--config-dir", str(tmp_path / "mine")], ["-cd", str(tmp_path / "mine")],
                 [f"--config-dir={tmp_path / 'mine'}"]):
        res = cli(*flag, "workload=forest", "experiment=quick", "--cfg", "job", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        cfg = yaml.safe_load(res.stdout)
        assert cfg["seed"] == 41 and cfg["forest"]["num_trees"] == 1
    info = cli("-cd", str(tmp_path / "mine"), "workload=forest", "--info", cwd=tmp_path)
    assert str(tmp_path / "mine") in info.stdout and "experiment: quick" not in info.stdout
    assert "quick" in info.stdout  # listed among the experiment group's options
    hydra = cli("workload=forest", "--cfg", "hydra", cwd=tmp_path)
    assert hydra.returncode == 0 and yaml.safe_load(hydra.stdout)["hydra"]["run"]["dir"]


def test_yaml_syntax_error_is_one_line_naming_file_and_line(tmp_path):
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "experiment" / "broken.yaml").write_text("seed: [1, 2\nforest: 3\n")
    res = cli("-cd", str(tmp_path / "mine"), "workload=forest", "experiment=broken", cwd=tmp_path)
    assert res.returncode == 2
    out = (res.stdout + res.stderr).strip().splitlines()
    assert len(out) == 1 and "broken.yaml:2" in out[0] and "YAML" in out[0], out
    missing = cli("--config-dir", str(tmp_path / "nowhere"), "workload=forest", cwd=tmp_path)
    assert missing.returncode == 2 and "--config-dir" in missing.stderr


def test_verbose_flag_is_hydras_v(tmp_path):
    res = cli("-v", "workload=forest", "--cfg", cwd=tmp_path)
    assert res.returncode == 0 and yaml.safe_load(res.stdout)["verbose"] is True


@pytest.mark.slow
def test_hydra_run_dir_names_the_run_folder(run_orchard, tmp_path):
    res = run_orchard("workload=tiny", f"hydra.run.dir={tmp_path}/mine/${{now:%Y}}")
    assert res.exit_code == 0
    folder = Path(res.run.data.tags["orchard.run_dir"])
    assert folder.parent == tmp_path / "mine" and folder.name.isdigit()
    assert (folder / ".hydra" / "config.yaml").is_file()
    hydra = yaml.safe_load((folder / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert hydra["run"]["dir"] == f"{tmp_path}/mine/${{now:%Y}}" and hydra["runtime"]["output_dir"] == str(folder)
