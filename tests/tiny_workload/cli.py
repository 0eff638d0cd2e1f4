"""Run ``python -m orchard`` with the tiny test workload registered, as a separate process:
for what only a real process shows (Ctrl-C, a crash mid-sweep, a second driver attaching)."""
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_BOOTSTRAP = ("from orchard import register_workload; "
              f"register_workload('tiny', 'tests.tiny_workload', {str(REPO / 'tests/tiny_workload/conf')!r}); "
              "from orchard.cli import main; main()")


def tiny_cli(*overrides: str) -> list[str]:
    """The argv of an orchard process that knows ``workload=tiny``."""
    return [sys.executable, "-c", _BOOTSTRAP, *overrides]


def tiny_cli_env() -> dict[str, str]:
    """Its environment: this checkout importable wherever the process starts."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


def main_in_process(argv: list[str], capfd) -> tuple[int, str]:
    """``python -m orchard <argv>`` in the test's own process, for a command refused before anything
    starts (the CLI's exit-2 paths): its exit code and what reached stderr (``capfd``: the file
    descriptor, as a terminal shows it)."""
    import pytest

    from orchard import cli

    from orchard.terminal import console

    capfd.readouterr()
    try:
        with pytest.raises(SystemExit) as ended:
            cli.main(argv)
    finally:
        console.release()  # a refusal after the console went quiet: the test's descriptors back
    return ended.value.code, capfd.readouterr().err
