"""Hydra's command-line conventions as a Hydra user expects them: every flag works as in a
``@hydra.main`` app or is refused in one line naming it (exit 2); ``--cfg`` shows what a run
uses; a multirun is checked whole before it starts and lays its jobs out as single runs are;
tab completion in bash.  None of these start Ray: each is a CLI call that exits while composing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchard.cli import main
from orchard.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def cli(*args: str, cwd: Path, **streams) -> subprocess.CompletedProcess:
    streams = streams or {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return subprocess.run([sys.executable, "-m", "orchard", *args], cwd=cwd, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, **streams)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m orchard <args>`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as code:
        main(list(args))
    out = capsys.readouterr()
    return code.value.code, out.out, out.err


@pytest.mark.parametrize("flags", [
    ["--version"], ["--hydra-help"], ["-c", "job"], ["--cfg"], ["--cfg=hydra"], ["-i"], ["--info", "searchpath"],
    ["--info", "defaults"], ["--info", "plugins"], ["--resolve", "--cfg", "job"], ["-p", "workload", "--cfg", "job"],
    ["-r", "--cfg", "all"], ["-sc", "install=bash"], ["-sc", "install=zsh"], ["-sc", "uninstall=bash"], ["-h"],
])
def test_every_hydra_flag_that_prints_works(flags, capsys):
    code, out, err = run_main(capsys, "workload=singa", *flags)
    assert code == 0, err
    assert out.strip() and not err.strip()


@pytest.mark.parametrize("flags,named", [
    (["-cp", "conf"], "-cp"), (["--config-path", "conf"], "--config-path"), (["-cn", "mine"], "-cn"),
    (["--config-name=mine"], "--config-name"), (["--experimental-rerun", "x.pickle"], "--experimental-rerun"),
    (["--nope"], "--nope"), (["-p", "workload"], "--package"), (["--resolve"], "--resolve"),
    (["--cfg=nope"], "--cfg"), (["-sc", "install=fish"], "-sc"), (["-m", "--cfg", "job"], "--cfg"),
    (["-p", "nope", "--cfg", "job"], "nope"),
])
def test_every_other_hydra_flag_is_refused_in_one_line_naming_it(flags, named, capsys):
    code, out, err = run_main(capsys, "workload=singa", *flags)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"orchard: bad config: {named}:"), err
    assert "LexerNoViableAlt" not in err + out


def test_cfg_prints_as_hydra_does_and_resolve_shows_what_the_run_uses(tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, written, _ = run_main(capsys, "workload=singa", f"output_dir={out_dir}", "--cfg", "hydra")
    hydra = yaml.safe_load(written)["hydra"]
    assert code == 0 and hydra["run"]["dir"] == "${output_dir}/${workload.name}/${orchard.run_id:}"
    assert hydra["sweep"] == {"dir": "${output_dir}/${workload.name}", "subdir": "${orchard.run_id:}"}
    code, resolved, _ = run_main(capsys, "workload=singa", f"output_dir={out_dir}", "--cfg", "hydra", "--resolve",
                                 "-p", "hydra.run")
    assert resolved.splitlines()[0] == "# @package hydra.run"
    assert yaml.safe_load(resolved)["dir"] == f"{out_dir}/singa/<run id>"
    # job: interpolations as written; --resolve: the values the run gets
    code, job, _ = run_main(capsys, "workload=singa", "--cfg", "job", "-p", "strategy")
    assert str(yaml.safe_load(job)["num_workers"]).startswith("${")
    code, job, _ = run_main(capsys, "workload=singa", "--cfg", "job", "--resolve", "-p", "strategy")
    assert isinstance(yaml.safe_load(job)["num_workers"], int)


def test_a_bad_key_is_one_line_whatever_flag_prints(capsys):
    for flags in (["--cfg", "job"], ["--cfg", "hydra", "--resolve"], ["--info"]):
        code, _, err = run_main(capsys, "workload=singa", "singa.lrr=1", *flags)
        assert code == 2 and err.strip() == ("orchard: bad config: singa.lrr: no such config key; did you mean "
                                             "singa.lr? (to add a new key on purpose: +singa.lrr=...)"), err


def test_info_into_a_pipe_closed_early_prints_no_broken_pipe(tmp_path):
    """``--info | head``: the reader is gone before orchard writes (the read end is closed first)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = cli("workload=singa", "--info", cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "" and proc.returncode == 141


def test_a_bad_key_under_multirun_is_one_line_exit_2_before_anything_starts(tmp_path):
    proc = cli("--multirun", "workload=singa", "singa.lrr=0.05,0.1", "tracking=none", f"output_dir={tmp_path}/m",
               cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "orchard: bad config: singa.lrr: no such config key; did you mean singa.lr? "
        "(to add a new key on purpose: +singa.lrr=...)"], proc.stderr
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "m").exists()


def test_multirun_jobs_are_hydras_combinations_in_folders_beside_single_runs(tmp_path):
    from orchard.run.multirun import prepare_jobs

    jobs = prepare_jobs([f"output_dir={tmp_path}", "workload=singa", "singa.lr=0.05,0.1", "seed=range(0,2)"])
    assert [cfg["_overrides"][1:] for cfg, _ in jobs] == [
        ["workload=singa", "singa.lr=0.05", "seed=0"], ["workload=singa", "singa.lr=0.05", "seed=1"],
        ["workload=singa", "singa.lr=0.1", "seed=0"], ["workload=singa", "singa.lr=0.1", "seed=1"]]
    assert [cfg["singa"]["lr"] for cfg, _ in jobs] == [0.05, 0.05, 0.1, 0.1]
    for num, (cfg, _) in enumerate(jobs):
        assert cfg["_run_dir"] == f"{tmp_path}/singa/<run id>"  # the run id once the job's run opens
        assert cfg["_hydra"]["mode"] == "MULTIRUN" and cfg["_hydra"]["job"]["num"] == num
    with pytest.raises(ConfigError) as err:  # a search, not a list: Ray Tune's job
        prepare_jobs(["workload=singa", "singa.lr=interval(0.01,0.1)"])
    assert err.value.key == "singa.lr" and "sweep=<name>" in err.value.allowed


def test_a_sweep_without_multirun_is_one_line(capsys):
    code, _, err = run_main(capsys, "workload=singa", "singa.lr=0.05,0.1")
    assert code == 2 and err.startswith("orchard: bad config: singa.lr: one value") and "--multirun" in err


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_groups_and_keys_of_python_m_orchard(tmp_path):
    script = cli("-sc", "install=bash", cwd=tmp_path).stdout
    program = f"{sys.executable} -m orchard"
    probe = f"""{script}
complete_line() {{ COMP_LINE="$1"; COMP_POINT=${{#COMP_LINE}}; read -ra COMP_WORDS <<< "$COMP_LINE";
  COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); COMPREPLY=(); _orchard_completion; echo "${{COMPREPLY[*]}}"; }}
complete_line "{program} workload=fo"
complete_line "{program} -v workload=singa singa.l"
complete_line "{sys.executable} elsewhere.py wor"
"""
    proc = subprocess.run(["bash", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = proc.stdout.splitlines()
    assert lines[0] == "workload=forest", proc.stdout + proc.stderr
    assert "singa.lr=" in lines[1].split()
    assert lines[2] == ""  # another python command line is left alone
    if shutil.which("zsh"):
        zsh = cli("-sc", "install=zsh", cwd=tmp_path).stdout
        checked = subprocess.run(["zsh", "-c", zsh], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stderr

