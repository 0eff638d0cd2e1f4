"""``python -m orchard workload=<name> [strategy=<name>] [key=value ...]``: parses argv only.

Everything a run goes through (config, checks, Ray, MLflow, the workload, its status and exit
code) is ``orchard/lifecycle.py``; ``runs`` and ``resume`` are its maintenance commands.
"""
from __future__ import annotations

import sys

from orchard import config as config_lib
from orchard import console, interrupts, lifecycle
from orchard.console import say
from orchard.errors import ConfigError

USAGE = """usage: python -m orchard workload=<name> [strategy=<name>] [group=option ...] [key=value ...]
       python -m orchard workload=<name> sweep=<name>          Ray Tune search, one MLflow run per trial
       python -m orchard --multirun workload=<name> key=a,b     Hydra multirun over a plain grid
       python -m orchard workload=<name> --cfg [job|hydra|all]  print the composed config and exit
       python -m orchard workload=<name> --info                 config search path, choices and groups
       python -m orchard resume <run id> [tracking.uri=...]     continue a KILLED or FAILED run from its checkpoint
       python -m orchard runs reap|list [tracking.uri=...]      close runs whose driver died (SIGKILL, OOM) / list open runs

options:
  --config-dir DIR, -cd DIR   your own config groups beside orchard's (DIR/experiment/mine.yaml -> experiment=mine)
  -v, --verbose               Ray's, Ray Train's and torch's own lines on the console (same as verbose=true)
  hydra.run.dir=DIR           the run's folder (default <output_dir>/<workload>/<run id>)

exit codes: 0 finished, 1 failed, 2 bad config or unreachable store/cluster, 130 Ctrl-C, 143 SIGTERM

config groups (conf/<group>/<option>.yaml):
{groups}
examples:
  python -m orchard workload=flower strategy=ring
  python -m orchard workload=flower strategy=ps strategy.mode=async strategy.num_servers=2
  python -m orchard workload=forest debug=smoke tracking=none
"""
CFG_PARTS = ("job", "hydra", "all")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with interrupts.raising():  # from the first instant: Ctrl-C while composing is 130 too
            _dispatch(argv)
    except KeyboardInterrupt as exc:
        say(f"orchard: {exc or 'interrupted'}", file=sys.stderr)
        sys.exit(interrupts.exit_code(exc))
    except Exception as exc:  # a bug in orchard: one line on the console, the traceback in the log
        import traceback

        traceback.print_exc()  # to the log file once the console is quiet, else to the terminal
        where = f"; traceback in {console.log_path()}" if console.active() else ""
        say(f"orchard: internal error: {type(exc).__name__}: {exc}{where}", file=sys.stderr)
        sys.exit(1)


def _take_options(argv: list[str]) -> list[str]:
    """Hydra's own flags orchard honours: ``--config-dir``/``-cd`` and ``-v``; the rest passes on."""
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

    from orchard import registry

    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(flag, f"an existing folder of config groups; {folder!r} is not one")
    registry.add_config_dir(str(path))


def _dispatch(argv: list[str]) -> None:
    try:
        argv = _take_options(argv)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        sys.exit(2)
    if any(a in ("-h", "--help") for a in argv):
        groups = "\n".join(f"  {g:<11} {', '.join(config_lib.group_options(g)) or '-'}" for g in config_lib.GROUPS)
        say(USAGE.format(groups=groups))
        sys.exit(0)
    if argv and argv[0] == "runs":
        from orchard import runs

        sys.exit(runs.main(argv[1:]))
    if argv and argv[0] == "resume":
        if len(argv) < 2 or "=" in argv[1]:
            say("usage: python -m orchard resume <run id> [tracking.uri=...]", file=sys.stderr)
            sys.exit(2)
        sys.exit(lifecycle.resume(argv[1], argv[2:]))
    if any(a in ("-m", "--multirun") for a in argv):
        from orchard.multirun import run_multirun

        sys.exit(run_multirun([a for a in argv if a not in ("-m", "--multirun")]))
    print_cfg, info, overrides = None, False, []
    for i, arg in enumerate(argv):
        if arg == "--cfg":  # Hydra's `--cfg job|hydra|all` (job when no word follows)
            print_cfg = argv[i + 1] if i + 1 < len(argv) and argv[i + 1] in CFG_PARTS else "job"
        elif i and argv[i - 1] == "--cfg" and arg in CFG_PARTS:
            continue
        elif arg == "--info":
            info = True
        else:
            overrides.append(arg)
    try:
        if print_cfg or info:
            sys.exit(_show(overrides, print_cfg, info))
        cfg, module = lifecycle.prepare(overrides)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(lifecycle.main(cfg, module))


def _show(overrides: list[str], part: str | None, info: bool) -> int:
    """``--cfg job|hydra|all`` and ``--info``: what Hydra would show for this composition."""
    import yaml

    from orchard import registry

    if info:
        cfg = config_lib.compose(overrides, return_hydra=True)
        say("config search path:")
        for folder in [str(config_lib.conf_dir()), *registry.extra_config_dirs()]:
            say(f"  {folder}")
        say("choices:")
        for group, option in (cfg.get("_choices") or {}).items():
            say(f"  {group}: {option}")
        say("groups:")
        for group in config_lib.GROUPS:
            say(f"  {group}: {', '.join(config_lib.group_options(group)) or '-'}")
        say(f"overrides: {' '.join(overrides) or '-'}")
    if part in ("job", "all"):
        cfg, _ = lifecycle.prepare(overrides)
        say(yaml.safe_dump({k: v for k, v in cfg.items() if not k.startswith("_")}, sort_keys=False))
    if part in ("hydra", "all"):
        say(yaml.safe_dump({"hydra": config_lib.hydra_node(overrides)}, sort_keys=False))
    return 0
