"""Hydra's command-line flags as orchard takes them: each works as in a ``@hydra.main`` app, or is
refused with one line naming it (exit 2); none reaches Hydra's override parser.

``--config-dir``/``-cd`` and orchard's own ``-v`` are taken first by the CLI (they apply to
``resume`` too); everything here concerns one composition.  ``--cfg`` and ``--info`` take their
word only when it is one of theirs, so ``--cfg workload=x`` still reads ``workload=x`` as an
override (Hydra's argparse would refuse it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from orchard.errors import ConfigError

CFG_PARTS = ("job", "hydra", "all")
INFO_PARTS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
SHELLS = ("bash", "zsh")
COMPLETION_VERBS = ("install", "uninstall", "query")

# (names, what it does in orchard): --hydra-help prints this table
HELP = (
    (("--help", "-h"), "orchard's usage, config groups and examples"),
    (("--hydra-help",), "this list of Hydra's flags"),
    (("--version",), "orchard's and Hydra's versions"),
    (("--cfg", "-c"), "print the config and exit: job (the default) | hydra | all; interpolations as written"),
    (("--resolve",), "with --cfg: resolved and checked, as the run gets it"),
    (("--package", "-p"), "with --cfg: only this part of the config (e.g. -p workload)"),
    (("--info", "-i"), "search path, defaults, config groups: all (the default) | config | defaults | "
                       "defaults-tree | plugins | searchpath"),
    (("--run", "-r"), "run one job (what orchard does anyway)"),
    (("--multirun", "-m"), "a job per combination of a,b / range() / choice() / glob() values"),
    (("--shell-completion", "-sc"), "install=bash|zsh, uninstall=bash|zsh: tab completion of groups and keys"),
    (("--config-dir", "-cd"), "your own config groups beside orchard's (DIR/experiment/mine.yaml: experiment=mine)"),
    (("--config-path", "-cp"), "refused: orchard's root is its conf/; add yours beside it with --config-dir DIR"),
    (("--config-name", "-cn"), "refused: the root config is conf/config.yaml; a preset of yours is experiment=<name> "
                               "(with --config-dir DIR)"),
    (("--experimental-rerun",), "refused: a run goes on with python -m orchard resume <run id>"),
    (("-v", "--verbose"), "orchard's own: Ray's, Ray Train's and torch's lines on the console (verbose=true)"),
)
REFUSED = {name: what.split(": ", 1)[1] for names, what in HELP if what.startswith("refused") for name in names}


@dataclass
class Flags:
    overrides: list[str] = field(default_factory=list)
    help: bool = False
    hydra_help: bool = False
    version: bool = False
    cfg: str | None = None        # job | hydra | all
    resolve: bool = False
    package: str | None = None
    info: str | None = None       # one of INFO_PARTS
    multirun: bool = False
    completion: tuple[str, str] | None = None  # (install | uninstall | query, bash | zsh)

    @property
    def shows(self) -> bool:
        """Prints something and exits without running."""
        return bool(self.help or self.hydra_help or self.version or self.cfg or self.info or self.completion)


def parse(argv: list[str]) -> Flags:
    """Split argv into Hydra's flags and the overrides; raises ConfigError naming a flag."""
    flags = Flags()
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, has_value, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        following = argv[i + 1] if i + 1 < len(argv) else None
        i += 1
        if not arg.startswith("-"):
            flags.overrides.append(arg)
        elif name in REFUSED:
            raise ConfigError(name, REFUSED[name])
        elif name in ("--help", "-h"):
            flags.help = True
        elif name == "--hydra-help":
            flags.hydra_help = True
        elif name == "--version":
            flags.version = True
        elif name in ("--run", "-r"):
            pass
        elif name in ("--multirun", "-m"):
            flags.multirun = True
        elif name == "--resolve":
            flags.resolve = True
        elif name in ("--cfg", "-c"):
            flags.cfg, i = _word(name, value if has_value else None, following, CFG_PARTS, "job", i)
        elif name in ("--info", "-i"):
            flags.info, i = _word(name, value if has_value else None, following, INFO_PARTS, "all", i)
        elif name in ("--package", "-p"):
            if not has_value and (following is None or following.startswith("-")):
                raise ConfigError(name, "a part of the config to print with --cfg, e.g. -p workload")
            flags.package, i = (value, i) if has_value else (following, i + 1)
        elif name in ("--shell-completion", "-sc"):
            word = value if has_value else following
            verb, _, shell = (word or "").partition("=")
            if verb not in COMPLETION_VERBS or shell not in SHELLS:
                raise ConfigError(name, f"install=bash|zsh or uninstall=bash|zsh; got {word!r}")
            flags.completion = (verb, shell)
            i += 0 if has_value else 1
        else:
            raise ConfigError(arg, "a flag orchard or Hydra knows (python -m orchard --hydra-help lists them)")
    if (flags.package or flags.resolve) and not flags.cfg:
        raise ConfigError("--package" if flags.package else "--resolve",
                          "only with --cfg job|hydra|all (it changes what --cfg prints)")
    if flags.multirun and (flags.cfg or flags.info):
        raise ConfigError("--cfg" if flags.cfg else "--info",
                          "one config at a time: drop --multirun and give one value per key")
    return flags


def _word(name: str, inline: str | None, following: str | None, choices: tuple, default: str, i: int):
    """The optional word after ``--cfg``/``--info``: inline (``--cfg=job``) must be one of
    ``choices``; the next argument is taken only when it is one."""
    if inline is not None:
        if inline not in choices:
            raise ConfigError(name, f"one of {', '.join(choices)}; got {inline!r}")
        return inline, i
    if following in choices:
        return following, i + 1
    return default, i


def hydra_help() -> str:
    width = max(len(", ".join(names)) for names, _ in HELP)
    rows = "\n".join(f"  {', '.join(names):<{width}}  {what}" for names, what in HELP)
    return ("Hydra's flags in orchard (python -m orchard [flags] key=value ...)\n"
            "Each works as in a @hydra.main app, or is refused in one line (exit 2).\n\n"
            f"{rows}\n\n"
            "Overrides follow Hydra's grammar (https://hydra.cc/docs/advanced/override_grammar/basic/):\n"
            "  group=option, key=value, +new.key=value, ++key=value, ~key; with -m, key=a,b sweeps.\n"
            "The run's folder is hydra.run.dir (a multirun's job: hydra.sweep.dir/hydra.sweep.subdir),\n"
            "<output_dir>/<workload>/<run id> unless you name one; --cfg hydra shows it.")
