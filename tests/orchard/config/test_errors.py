"""orchard/config/errors.py on its own: each of Hydra's composition failures becomes one
ConfigError naming the key, built from the parsed overrides and Hydra's exception data (the
end-to-end lines through ``prepare`` and the CLI: test_config.py). No composition, no Ray."""
from pathlib import Path

import pytest

from orchard.config import errors as config_errors
from orchard.errors import ConfigError

KNOWN = {"seed": 0, "tiny": {"lr": 0.1, "steps": 5, "optimizer": {"momentum": 0.9}}}


def test_an_override_that_does_not_parse_is_named_with_how_to_write_it():
    with pytest.raises(ConfigError) as bad:
        config_errors.parse(["tiny.lr=0.1", "tiny.steps=[1"])
    assert bad.value.key == "tiny.steps"  # the one that failed, not the first
    assert "Hydra's grammar" in bad.value.allowed and "quote a value" in bad.value.allowed
    with pytest.raises(ConfigError) as flag:  # a dash: a flag, not a value in the wrong grammar
        config_errors.parse(["--nope"])
    assert flag.value.key == "--nope" and "--hydra-help" in flag.value.allowed
    assert [o.input_line for o in config_errors.parse(["seed=1", "+tiny.x=2"])] == ["seed=1", "+tiny.x=2"]


@pytest.mark.parametrize("key, hint", [
    ("tiny.lrr", "; did you mean tiny.lr?"),                    # a sibling first
    ("tiny.momentm", "; did you mean tiny.optimizer.momentum?"),  # then a key further down
    ("sed", "; did you mean seed?"),                            # at the top level
    ("tiny.zzzzzz", "; keys here: lr, optimizer, steps"),       # nothing close: what there is
    ("nope.x", ""),                                             # under no section at all
])
def test_a_misspelt_key_is_pointed_at_the_closest_one_that_exists(key, hint):
    assert config_errors.did_you_mean(key, KNOWN) == hint


def test_an_unknown_key_says_how_to_add_it_on_purpose():
    err = config_errors.unknown_key("tiny.lrr", KNOWN)
    assert str(err) == ("tiny.lrr: no such config key; did you mean tiny.lr? "
                        "(to add a new key on purpose: +tiny.lrr=...)")


@pytest.mark.parametrize("overrides, key, words", [
    (["tiny.lr=1", "+seed=1"], "seed", "already exists; drop the leading '+'"),
    (["~tiny.nope"], "tiny.nope", "no such config key to delete"),
    (["tiny.lrr=1", "~nope"], "tiny.lrr", "did you mean tiny.lr?"),  # the first that fails, in order
])
def test_each_key_override_is_checked_as_hydra_applies_it(overrides, key, words):
    err = config_errors.locate(config_errors.parse(overrides), KNOWN)
    assert err.key == key and words in err.allowed


def test_key_overrides_that_apply_are_not_reported():
    """New keys with '+', '++' on an existing one, deleting one that exists, and '+' of a whole
    section merged onto an existing one (Hydra allows it) find nothing to report."""
    fine = ["tiny.lr=2", "+tiny.new=1", "++seed=3", "~tiny.steps", "+tiny={a: 1}"]
    assert config_errors.locate(config_errors.parse(fine), KNOWN) is None


def test_a_missing_group_option_lists_the_options_of_that_group():
    from hydra.errors import MissingConfigException

    listed = MissingConfigException("", missing_cfg_file="strategy/nope", options=["ps", "ring"])
    assert str(config_errors.missing_config(listed, lambda group: [])) == "strategy: one of ps, ring; got 'nope'"
    unlisted = MissingConfigException("", missing_cfg_file="strategy/nope", options=None)  # asked of the search path
    assert config_errors.missing_config(unlisted, lambda group: [f"{group}-a"]).allowed == "one of strategy-a; got 'nope'"
    top = MissingConfigException("", missing_cfg_file="mine", options=None)
    assert config_errors.missing_config(top, lambda group: []).key == "config"


def test_group_overrides_are_told_from_key_overrides_by_the_search_paths_folders(tmp_path):
    (tmp_path / "mine").mkdir()  # a user's --config-dir with a group of its own
    dirs = [Path(__file__).resolve().parents[3] / "conf", tmp_path]
    parsed = config_errors.parse(["workload=tiny", "singa/arch=x", "mine=a", "hydra/launcher=basic", "seed=1", "tiny.lr=1"])
    assert [config_errors.is_group(o, dirs) for o in parsed] == [True, True, True, True, False, False]


def test_omegaconfs_error_names_its_key_and_an_unknown_key_is_left_for_the_suggestion():
    from dataclasses import dataclass

    from omegaconf import OmegaConf

    @dataclass
    class Typed:
        steps: int = 1

    with pytest.raises(Exception) as bad_value:
        OmegaConf.structured(Typed).steps = "many"
    err = config_errors.from_omegaconf(bad_value.value)
    assert err.key == "steps" and "could not be converted to Integer" in err.allowed and "\n" not in err.allowed
    strict = OmegaConf.create({"tiny": {"lr": 1}})
    OmegaConf.set_struct(strict, True)
    with pytest.raises(Exception) as unknown:
        strict.tiny.lrr = 1
    assert config_errors.from_omegaconf(unknown.value) is None  # the caller adds "did you mean"
    assert config_errors.unknown_key_name(unknown.value) == "tiny.lrr"
    assert config_errors.unknown_key_name(bad_value.value) is None


def test_the_groups_a_root_config_leaves_to_the_command_line_are_its_question_marks(tmp_path):
    root = tmp_path / "config.yaml"
    root.write_text("defaults:\n  - _self_\n  - workload: ???\n  - cluster: local\n  - dataset: ???\n")
    assert config_errors.required_groups(root) == ["workload", "dataset"]
    assert config_errors.required_groups(Path(__file__).resolve().parents[3] / "conf" / "config.yaml") == ["workload"]
