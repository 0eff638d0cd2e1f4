"""orchard/cli/completion.py on its own: what ``-sc query=bash`` offers for the line in
``COMP_LINE`` (groups, options and keys from orchard's search path, for ``orchard`` and
``python -m orchard`` alike) and the scripts ``-sc install|uninstall`` print. In this process,
no shell (bash itself driving the script: test_flags.py), no Ray."""
import pytest

from orchard.cli import completion
from orchard.config import registry


@pytest.fixture
def offered(monkeypatch):
    """``offered(line) -> list[str]``: the completions for ``line`` with the cursor at its end."""
    # --config-dir on a line adds a search folder: each test's stays its own
    monkeypatch.setattr(registry, "_CONFIG_DIRS", list(registry._CONFIG_DIRS))
    monkeypatch.setattr(registry, "_USER_DIRS", list(registry._USER_DIRS))

    def _offered(line: str) -> list[str]:
        monkeypatch.setenv("COMP_LINE", line)
        return completion.query().split()

    return _offered


@pytest.mark.parametrize("program", ["orchard", "python -m orchard", "/usr/bin/python3.11 -m orchard"])
def test_a_group_option_is_completed_whichever_way_orchard_is_started(offered, program):
    assert offered(f"{program} workload=fo") == ["workload=forest"]


def test_the_keys_of_the_chosen_workload_are_offered_and_orchards_own_flags_are_skipped(offered):
    assert "tiny.lr=" in offered("orchard -v workload=tiny tiny.") and "tiny.steps=" in offered("orchard workload=tiny tiny.")
    assert "singa.lr=" in offered("python -m orchard --verbose workload=singa singa.l")


def test_a_new_word_is_offered_every_group_and_top_level_key(offered):
    words = offered("orchard workload=tiny ")
    assert {"strategy=", "sweep=", "experiment=", "tracking.", "tiny.", "seed="} <= set(words)


def test_a_users_config_dir_on_the_line_adds_its_groups(offered, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "alpha.yaml").write_text("a: 1\n")
    assert offered(f"orchard -cd {tmp_path} workload=tiny mine=") == ["mine=alpha"]
    assert offered(f"orchard --config-dir {tmp_path / 'no-such'} workload=fo") == ["workload=forest"]


@pytest.mark.parametrize("line", ["orchard workload=nope x", "orchard workload=tiny 'tiny.l"])  # a quote not closed yet
def test_a_line_hydra_cannot_compose_offers_nothing_rather_than_a_traceback(offered, line):
    assert offered(line) == []


def test_install_prints_the_script_for_the_shell_and_uninstall_removes_it():
    bash, zsh = completion.script("install", "bash"), completion.script("install", "zsh")
    assert "complete -o nospace -o default -F _orchard_completion orchard python python3" in bash
    assert zsh == "autoload -Uz bashcompinit && bashcompinit\n" + bash   # zsh runs the same through bashcompinit
    assert bash.count("-sc query=bash") == 1
    removal = completion.script("uninstall", "bash")
    assert "complete -r orchard python python3" in removal and "unset -f _orchard_completion" in removal
