"""orchard/cli/show.py on its own: what ``--version``, ``--cfg``/``--resolve``/``-p`` and ``--info``
print, called in this process on the tests' workload (which flags exist and exit codes: the CLI's
test_flags.py). Composition only, no Ray."""
from importlib.metadata import version

import pytest
import yaml

from orchard.cli import show
from orchard.errors import ConfigError


def test_version_names_orchard_and_what_it_runs_on_as_installed():
    assert show.version() == (f"orchard {version('orchard')}, Ray {version('ray')}, MLflow {version('mlflow')}, "
                              f"Hydra {version('hydra-core')}, OmegaConf {version('omegaconf')}, "
                              f"torch {version('torch')}")


def test_resolve_prints_the_config_the_run_gets_without_orchards_bookkeeping(capsys, tmp_path):
    from orchard.run.lifecycle import prepare

    overrides = ["workload=tiny", "tiny.lr=0.05", f"output_dir={tmp_path}"]
    show.show_cfg(overrides, "job", True, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    cfg, _ = prepare(overrides)
    assert printed == {k: v for k, v in cfg.items() if not k.startswith("_")}
    assert printed["tiny"]["lr"] == 0.05 and "_run_dir" not in printed


def test_a_package_that_is_one_value_prints_the_bare_value_for_a_script_to_read(capsys):
    show.show_cfg(["workload=tiny", "tiny.steps=7"], "job", True, "tiny.steps")
    assert capsys.readouterr().out == "7\n"
    show.show_cfg(["workload=tiny"], "job", True, "tiny")   # a section: under its package header
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# @package tiny" and "steps: 50" in lines


def test_a_package_that_is_not_there_is_refused_listing_the_top_level_keys():
    with pytest.raises(ConfigError) as err:
        show.show_cfg(["workload=tiny"], "job", False, "tiny.nope")
    assert err.value.key == "tiny.nope"
    assert "--cfg job" in err.value.allowed and "top-level keys: " in err.value.allowed and "tracking" in err.value.allowed


def test_info_says_the_choices_every_groups_options_the_overrides_and_the_run_folder(capsys, tmp_path):
    show.show_info(["workload=tiny", "seed=3", f"output_dir={tmp_path}"], "all")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "config search path:"
    assert any(line.strip().endswith("tests/tiny_workload/conf") for line in lines)  # a registered workload's own
    assert "  workload: tiny" in lines[lines.index("choices:"):lines.index("groups:")]
    assert "tiny" in next(line for line in lines if line.startswith("  workload: ") and "," in line).split(", ")
    assert lines[-2:] == [f"overrides: workload=tiny seed=3 output_dir={tmp_path}", f"run folder: {tmp_path}/tiny/<run id>"]


def test_info_plugins_says_none_are_used_without_composing(capsys):
    show.show_info(["workload=nope"], "plugins")   # a bad workload does not matter: nothing is composed
    assert capsys.readouterr().out.startswith("Hydra plugins: none used.")
