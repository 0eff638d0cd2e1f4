"""``python -m orchard workload=<name> [strategy=<name>] [key=value ...]``: parses argv only.

Everything a run goes through (config, checks, Ray, MLflow, the workload, its status and exit
code) is ``orchard/lifecycle.py``; ``runs`` and ``resume`` are its maintenance commands.
"""
from __future__ import annotations

import sys

from orchard import config as config_lib
from orchard import interrupts, lifecycle
from orchard.errors import ConfigError

USAGE = """usage: python -m orchard workload=<name> [strategy=<name>] [group=option ...] [key=value ...]
       python -m orchard workload=<name> sweep=<name>          Ray Tune search, one MLflow run per trial
       python -m orchard --multirun workload=<name> key=a,b     Hydra multirun over a plain grid
       python -m orchard workload=<name> --cfg                  print the composed config and exit
       python -m orchard resume <run id> [tracking.uri=...]     continue a KILLED or FAILED run from its checkpoint
       python -m orchard runs reap|list [tracking.uri=...]      close runs whose driver died (SIGKILL, OOM) / list open runs

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
    except KeyboardInterrupt as exc:
        print(f"orchard: {exc or 'interrupted'}", file=sys.stderr)
        sys.exit(interrupts.exit_code(exc))


def _dispatch(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv):
        groups = "\n".join(f"  {g:<11} {', '.join(config_lib.group_options(g)) or '-'}" for g in config_lib.GROUPS)
        print(USAGE.format(groups=groups))
        sys.exit(0)
    if argv and argv[0] == "runs":
        from orchard import runs

        sys.exit(runs.main(argv[1:]))
    if argv and argv[0] == "resume":
        if len(argv) < 2 or "=" in argv[1]:
            print("usage: python -m orchard resume <run id> [tracking.uri=...]", file=sys.stderr)
            sys.exit(2)
        sys.exit(lifecycle.resume(argv[1], argv[2:]))
    if any(a in ("-m", "--multirun") for a in argv):
        from orchard.multirun import run_multirun

        sys.exit(run_multirun([a for a in argv if a not in ("-m", "--multirun")]))
    print_cfg = "--cfg" in argv
    overrides = [a for a in argv if a != "--cfg"]
    try:
        cfg, module = lifecycle.prepare(overrides)
    except ConfigError as err:
        print(f"orchard: bad config: {err}", file=sys.stderr)
        sys.exit(2)
    if print_cfg:
        import yaml

        print(yaml.safe_dump({k: v for k, v in cfg.items() if not k.startswith("_")}, sort_keys=False))
        sys.exit(0)
    sys.exit(lifecycle.main(cfg, module))
