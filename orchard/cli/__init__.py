"""``python -m orchard workload=<name> [strategy=<name>] [key=value ...]``: parses argv only.

Everything a run goes through (config, checks, Ray, MLflow, the workload, its status and exit
code) is ``orchard/run/lifecycle.py``; ``runs`` (orchard/cli/runs.py), ``resume`` (orchard/run/resume.py) and ``ui``
(orchard/cli/ui.py) are its maintenance commands.
"""
from __future__ import annotations

import sys

from orchard import config as config_lib
from orchard.cli import flags as flag_lib
from orchard.errors import ConfigError
from orchard.run import lifecycle
from orchard.terminal import console, interrupts
from orchard.terminal.console import say

USAGE = """usage: python -m orchard workload=<name> [strategy=<name>] [group=option ...] [key=value ...]
       python -m orchard workload=<name> sweep=<name>          Ray Tune search, one MLflow run per trial
       python -m orchard --multirun workload=<name> key=a,b     Hydra multirun over a plain grid
       python -m orchard workload=<name> --cfg [job|hydra|all] [--resolve] [-p PACKAGE]   print the config and exit
       python -m orchard workload=<name> --info [searchpath|defaults|config|...]   search path, choices and groups
       python -m orchard --hydra-help | --version | -sc install=bash|zsh   Hydra's flags / versions / tab completion
       python -m orchard resume <run id> [tracking.uri=...]     continue a KILLED or FAILED run from its checkpoint
       python -m orchard runs list|show|compare|reap [tracking.uri=...]   the store's runs: list, one again, side by side; close runs whose driver died
       python -m orchard ui [<run id>] [tracking.uri=...] [port=N]   the MLflow UI on the store (127.0.0.1), in its training view

options:
  --config-dir DIR, -cd DIR   your own config groups beside orchard's (DIR/experiment/mine.yaml -> experiment=mine)
  -v, --verbose               Ray's, Ray Train's and torch's own lines on the console (same as verbose=true)
  hydra.run.dir=DIR           the run's folder (default <output_dir>/<workload>/<run id>; a multirun's jobs too)
  (--hydra-help lists every Hydra flag and what it does here)

exit codes: 0 finished, 1 failed, 2 bad config or unreachable store/cluster, 130 Ctrl-C, 143 SIGTERM

config groups (conf/<group>/<option>.yaml):
{groups}
examples:
  python -m orchard workload=flower strategy=ring
  python -m orchard workload=flower strategy=ps strategy.mode=async strategy.num_servers=2
  python -m orchard workload=forest debug=smoke tracking=none
"""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with interrupts.raising():  # from the first instant: Ctrl-C while composing is 130 too
            _dispatch(argv)
        _flush_stdout()
    except SystemExit:
        _flush_stdout()
        raise
    except BrokenPipeError:  # `--info | head`: the reader has gone; nothing is wrong here
        _stdout_to_devnull()
        sys.exit(BROKEN_PIPE_EXIT)
    except KeyboardInterrupt as exc:
        say(f"orchard: {exc or 'interrupted'}", file=sys.stderr)
        sys.exit(interrupts.exit_code(exc))
    except Exception as exc:  # a bug in orchard: one line on the console, the traceback in the log
        import traceback

        from orchard.config import redact

        # to the log file once the console is quiet, else to the terminal; masked like every line
        print(redact.text(traceback.format_exc()), file=sys.stderr, end="", flush=True)
        where = f"; traceback in {console.log_path()}" if console.active() else ""
        say(f"orchard: internal error: {type(exc).__name__}: {exc}{where}", file=sys.stderr)
        sys.exit(1)


BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE: what a reader that stops early leaves any Unix tool with


def _flush_stdout() -> None:
    """Flush now, so a closed pipe is met here and not as Python's "Exception ignored" at exit."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        sys.exit(BROKEN_PIPE_EXIT)


def _stdout_to_devnull() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere, quietly


def _take_options(argv: list[str]) -> list[str]:
    """``--config-dir``/``-cd`` and ``-v``, wherever they are (``resume`` takes them too)."""
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("--config-dir", "-cd"):
            folder = next(args, None)
            if folder is None:
                raise ConfigError(arg, "a folder of config groups (e.g. DIR/experiment/mine.yaml)")
            _add_config_dir(arg, folder)
        elif arg.startswith("--config-dir="):
            _add_config_dir("--config-dir", arg.split("=", 1)[1])
        elif arg in ("-v", "--verbose"):
            rest.append("verbose=true")
        else:
            rest.append(arg)
    return rest


def _add_config_dir(flag: str, folder: str) -> None:
    from pathlib import Path

    from orchard.config import registry

    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(flag, f"an existing folder of config groups; {folder!r} is not one")
    registry.add_config_dir(str(path))


def _dispatch(argv: list[str]) -> None:
    try:
        argv = _take_options(argv)
        if argv and argv[0] in ("runs", "resume", "ui"):
            sys.exit(_maintenance(argv))
        flags = flag_lib.parse(argv)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        sys.exit(2)
    if flags.shows:
        sys.exit(_show(flags))
    if flags.multirun:
        from orchard.run.multirun import run_multirun

        sys.exit(run_multirun(flags.overrides, console=True))
    try:
        cfg, module = lifecycle.prepare(flags.overrides)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(lifecycle.main(cfg, module))


def _maintenance(argv: list[str]) -> int:
    if argv[0] == "runs":
        from orchard.cli.runs import runs_command

        return runs_command(argv[1:])
    if argv[0] == "ui":
        from orchard.cli.ui import ui_command

        return ui_command(argv[1:])
    if len(argv) < 2 or "=" in argv[1]:
        say("usage: python -m orchard resume <run id> [tracking.uri=...]", file=sys.stderr)
        return 2
    from orchard.run import resume

    return resume.resume(argv[1], argv[2:])


def _show(flags) -> int:
    """The flags that print and exit (nothing starts): a bad key is still one line, exit 2."""
    from orchard.cli import completion
    from orchard.cli import show

    try:
        if flags.help:
            groups = "\n".join(f"  {g:<11} {', '.join(config_lib.group_options(g)) or '-'}" for g in config_lib.GROUPS)
            say(USAGE.format(groups=groups))
        elif flags.hydra_help:
            say(flag_lib.hydra_help())
        elif flags.version:
            say(show.version())
        elif flags.completion:
            verb, shell = flags.completion
            say(completion.query() if verb == "query" else completion.script(verb, shell).rstrip("\n"))
        else:
            if flags.info:
                show.show_info(flags.overrides, flags.info)
            if flags.cfg:
                show.show_cfg(flags.overrides, flags.cfg, flags.resolve, flags.package)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        return 2
    return 0
