"""What the printing flags print, then exit: ``--cfg``/``--resolve``/``-p``, ``--info``,
``--version``.  Each composition is checked first, so a bad key is one line and exit 2 here too.

``--cfg`` prints as Hydra does: interpolations as written (``${output_dir}/...``); with
``--resolve`` the config as the run gets it (resolved and checked), and ``hydra`` with the run's
folder where ``${orchard.run_id:}`` stands for the MLflow run id it will have.
"""
from __future__ import annotations

from orchard import config as config_lib
from orchard.errors import ConfigError
from orchard.terminal.console import say


# what a bug report needs beside orchard's own: read from the installed metadata, nothing imported
VERSIONS = (("orchard", "orchard"), ("Ray", "ray"), ("MLflow", "mlflow"), ("Hydra", "hydra-core"),
            ("OmegaConf", "omegaconf"), ("torch", "torch"))


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    parts = []
    for label, dist in VERSIONS:
        try:
            parts.append(f"{label} {installed(dist)}")
        except PackageNotFoundError:  # a checkout run without `pip install -e .`; the core without torch
            parts.append(f"{label} (not installed)")
    return ", ".join(parts)


def show_cfg(overrides: list[str], part: str, resolve: bool, package: str | None) -> None:
    """``--cfg job|hydra|all [--resolve] [-p PACKAGE]``."""
    from omegaconf import OmegaConf

    from orchard.run import lifecycle

    cfg, _ = lifecycle.prepare(overrides)  # checked as a run is: a bad key or value is one line
    if resolve:
        job = {k: v for k, v in cfg.items() if not k.startswith("_")}
        hydra = _resolved_hydra(overrides, cfg["_run_dir"])
    else:
        written = config_lib.unresolved(overrides)
        hydra = written.pop("hydra")
        job = written
    shown = {"job": job, "hydra": {"hydra": hydra}, "all": {**job, "hydra": hydra}}[part]
    if package and package != "_global_":
        node = _select(shown, package)
        if node is None:
            raise ConfigError(package, f"a part of the --cfg {part} config (-p/--package); "
                              f"top-level keys: {', '.join(shown)}")
        if not isinstance(node, dict):
            say(str(node))
            return
        say(f"# @package {package}")
        shown = node
    say(OmegaConf.to_yaml(OmegaConf.create(shown)).rstrip("\n"))


def _resolved_hydra(overrides: list[str], run_dir: str) -> dict:
    from omegaconf import OmegaConf

    with config_lib.hydra_context():
        cfg = config_lib.compose_node([*overrides, *config_lib.searchpath_override()])
        # Hydra fills it in when a job starts; here it is the folder the run will have
        OmegaConf.update(cfg, "hydra.runtime.output_dir", run_dir, force_add=True)
        return OmegaConf.to_container(cfg.hydra, resolve=True, enum_to_str=True)


def _select(node, dotted: str):
    for part in dotted.replace("/", ".").split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def show_info(overrides: list[str], part: str) -> None:
    """``--info [all|config|defaults|defaults-tree|plugins|searchpath]``."""
    from orchard.config import registry

    if part == "plugins":
        say("Hydra plugins: none used. --multirun runs its jobs one after another in one Ray session "
            "(orchard/run/multirun.py); a search is sweep=<name> (Ray Tune, docs/sweeps.md)")
        return
    cfg = config_lib.compose(overrides, return_hydra=True)
    if part in ("all", "searchpath"):
        say("config search path:")
        for folder in [str(config_lib.conf_dir()), *registry.extra_config_dirs()]:
            say(f"  {folder}")
    if part in ("all", "defaults", "defaults-tree"):
        say("choices:")
        for group, option in (cfg.get("_choices") or {}).items():
            say(f"  {group}: {option}")
    if part == "all":
        say("groups:")
        for group in config_lib.GROUPS:
            say(f"  {group}: {', '.join(config_lib.group_options(group)) or '-'}")
        say(f"overrides: {' '.join(overrides) or '-'}")
        say(f"run folder: {cfg['_run_dir']}")
    if part == "config":
        show_cfg(overrides, "job", False, None)
