"""Config composition (Hydra 1.3) and validation, all before Ray starts.

Everything past this module sees plain dicts: ``compose`` returns the resolved config as a
container, so Ray, Tune, MLflow and workers never import Hydra.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable

from orchard.config import errors as config_errors
from orchard.config import registry
from orchard.errors import ConfigError

GROUPS = ("workload", "strategy", "cluster", "tracking", "sweep", "experiment", "debug")


def conf_dir() -> Path:
    """The shipped ``conf/`` folder: beside the package in a checkout, inside it in a wheel."""
    here = Path(__file__).resolve().parents[1]   # orchard/, beside which conf/ lies in a checkout
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError("orchard's conf/ folder is missing from this installation")


def group_options(group: str) -> list[str]:
    dirs = [conf_dir()] + [Path(d) for d in registry.extra_config_dirs()]
    found = {p.stem for d in dirs for p in (d / group).glob("*.yaml")}
    return sorted(found)


def searchpath_override() -> list[str]:
    """Hydra's search path for registered workloads' and ``--config-dir`` folders (or nothing)."""
    extra = registry.extra_config_dirs()
    return ["hydra.searchpath=[" + ",".join(f"file://{d}" for d in extra) + "]"] if extra else []


MODEL_SCHEMES = ("runs:/", "models:/")  # model= values MLflow resolves; anything else is a path

RUN_ID = "<run id>"  # what ${orchard.run_id:} stands for until the run opens: then its MLflow run id
# Hydra's launchers and sweepers: orchard runs a multirun's jobs itself (orchard/run/multirun.py)
NOT_USED = ("hydra/launcher", "hydra/sweeper", "hydra.launcher", "hydra.sweeper")


def compose(overrides: Iterable[str] = (), return_hydra: bool = False) -> dict:
    """Compose ``conf/config.yaml`` with command-line style overrides into a plain dict.

    With ``return_hydra`` it also carries ``_choices`` (group -> option), ``_hydra`` (the
    ``hydra`` node, unresolved, as ``.hydra/hydra.yaml`` keeps it) and ``_run_dir`` (the run's
    folder: ``hydra.run.dir``, or ``hydra.sweep.dir``/``subdir`` for a multirun's job, resolved,
    with ``RUN_ID`` where the run id goes).  Raises ``ConfigError`` (one line) for unknown keys,
    unknown group options and bad values (orchard/config/errors.py).
    """
    import yaml
    from hydra.errors import ConfigCompositionException, MissingConfigException
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    overrides = [*overrides, *searchpath_override()]
    parsed = config_errors.parse(overrides)
    for override in parsed:
        if override.is_sweep_override():
            raise ConfigError(override.key_or_group, f"one value in a single run; {override.input_line!r} is a sweep: "
                              "add --multirun (a list is [a,b], a string with a comma is quoted: 'a,b')")
        if override.key_or_group.startswith(NOT_USED):
            raise ConfigError(override.key_or_group, "left as it is: orchard runs a multirun's jobs one after another in "
                              "one Ray session; for a search use sweep=<name> (Ray Tune, docs/sweeps.md)")
    try:
        with hydra_context():
            cfg = compose_node(overrides)
            hydra = cfg.hydra
            if hydra.job.chdir:
                raise ConfigError("hydra.job.chdir", "false: orchard never changes the working directory "
                                  "(the run's folder is hydra.run.dir; relative paths are the current folder's)")
            multirun = hydra.mode == RunMode.MULTIRUN
            run_dir = (f"{hydra.sweep.dir}/{hydra.sweep.subdir}" if multirun else hydra.run.dir) if return_hydra else None
            node = OmegaConf.to_container(hydra, resolve=False, enum_to_str=True) if return_hydra else None
            choices = {k: v for k, v in hydra.runtime.choices.items() if not k.startswith("hydra")}
            with open_dict(cfg):
                del cfg["hydra"]
            plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingConfigException as exc:
        raise config_errors.missing_config(exc, group_options) from None
    except ConfigCompositionException as exc:
        raise _composition_error(exc, parsed) from None
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(str(key), str(exc).splitlines()[0]) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc) from None
    if return_hydra:
        plain["_choices"] = choices
        plain["_hydra"] = node
        plain["_run_dir"] = str(run_dir)
    return plain


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("orchard.run_id"):
        OmegaConf.register_new_resolver("orchard.run_id", lambda: RUN_ID)


@contextmanager
def hydra_context():
    """Hydra initialized on orchard's ``conf/`` (job name ``orchard``), cleared again after."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    _register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="orchard"):
            yield GlobalHydra.instance()
    finally:
        GlobalHydra.instance().clear()


def compose_node(overrides: list[str]):
    """Hydra's composition (a DictConfig with its ``hydra`` node), inside ``hydra_context``."""
    from hydra import compose as hydra_compose

    return hydra_compose("config", overrides=overrides, return_hydra_config=True)


def _composition_error(exc, parsed: list) -> ConfigError:
    """Hydra could not compose: say which override, from structured information only."""
    from hydra.errors import ConfigCompositionException, MissingConfigException
    from omegaconf import OmegaConf

    found = config_errors.from_omegaconf(exc.__cause__)
    if found is not None:  # a value the key does not take (its OmegaConf error names the key)
        return found
    dirs = [conf_dir(), *map(Path, registry.extra_config_dirs())]
    groups = [o for o in parsed if config_errors.is_group(o, dirs)]
    given = {o.key_or_group for o in groups}
    for group in config_errors.required_groups(conf_dir() / "config.yaml"):
        if group not in given:
            return ConfigError(group, f"required: {group}=<one of {', '.join(group_options(group))}>")
    try:  # the config the group overrides make: every key override is checked against it
        with hydra_context():
            # (hydra.* keys too: hydra.searchpath finds registered workloads' groups)
            base_overrides = [o.input_line for o in parsed if o in groups or o.key_or_group.startswith("hydra.")]
            base = OmegaConf.to_container(compose_node(base_overrides), resolve=False)
        base.pop("hydra", None)  # Hydra's own node: not among the keys a hint offers
    except MissingConfigException as again:
        return config_errors.missing_config(again, group_options)
    except ConfigCompositionException:
        for override in groups:
            if override.key_or_group not in GROUPS and not override.key_or_group.startswith("hydra/"):
                return ConfigError(override.key_or_group, f"a group in the defaults list ({', '.join(GROUPS)}); "
                                   f"to add one that is not: +{override.input_line}")
        return ConfigError("config", str(exc).strip().splitlines()[0])
    unknown = config_errors.unknown_key_name(exc.__cause__)
    if unknown:
        return config_errors.unknown_key(unknown, base)
    keys = [o for o in parsed if o not in groups]
    return config_errors.locate(keys, base) or ConfigError("config", str(exc).strip().splitlines()[0])


def unresolved(overrides: Iterable[str]) -> dict:
    """The whole composition (its ``hydra`` node too) as ``--cfg`` prints it: interpolations as
    written.  Call ``compose`` first: errors here are Hydra's own."""
    from omegaconf import OmegaConf

    with hydra_context():
        cfg = compose_node([*overrides, *searchpath_override()])
        return OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)


def _yaml_error(exc) -> ConfigError:
    """A YAML syntax error in a config file: the file and line, not Hydra's 100-line traceback."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return ConfigError("config file", f"valid YAML; {problem}")
    return ConfigError(f"{mark.name}:{mark.line + 1}", f"valid YAML; {problem} (line {mark.line + 1}, column {mark.column + 1})")


def compose_with_hints(overrides: Iterable[str]) -> dict:
    """``compose`` with everything a run needs from Hydra (choices, the hydra node, its folder)."""
    return compose(list(overrides), return_hydra=True)


# --------------------------------------------------------------------------- validation helpers
def get(cfg: dict, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(key, "missing from the config")
        node = node[part]
    return node


def require(cfg: dict, key: str, ok: Callable[[Any], bool], allowed: str) -> Any:
    """Return ``cfg[key]`` if ``ok(value)``, else raise ``ConfigError(key, allowed + got)``."""
    value = get(cfg, key)
    try:
        good = ok(value)
    except Exception:
        good = False
    if not good:
        raise ConfigError(key, f"{allowed}, got {value!r}")
    return value


def require_positive(cfg: dict, key: str, integer: bool = False) -> Any:
    kind = "a positive integer" if integer else "a positive number"
    return require(
        cfg, key,
        lambda v: not isinstance(v, bool) and (isinstance(v, int) if integer else isinstance(v, (int, float))) and v > 0,
        kind,
    )


def require_choice(cfg: dict, key: str, choices: Iterable[Any]) -> Any:
    choices = list(choices)
    return require(cfg, key, lambda v: v in choices, "one of " + ", ".join(map(str, choices)))


def require_path(cfg: dict, key: str, kind: str = "any", allow_none: bool = True) -> Any:
    """A path that must exist (``kind``: any | dir | file); ``None`` passes when allowed."""
    value = get(cfg, key)
    if value is None and allow_none:
        return None
    path = Path(os.path.expanduser(str(value)))
    exists = {"dir": path.is_dir(), "file": path.is_file()}.get(kind, path.exists())
    if not exists:
        what = {"dir": "an existing folder", "file": "an existing file"}.get(kind, "an existing path")
        raise ConfigError(key, f"{what}; {str(value)!r} does not exist")
    return value


def ensure_writable(folder: Path) -> None:
    """Create ``folder`` if needed and prove a file can be written there; raises OSError."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".orchard-probe-{os.getpid()}"
    probe.write_text("")
    probe.unlink()


def validate(cfg: dict, module) -> None:
    """Core checks, then the workload's own ``validate``; raises ``ConfigError``."""
    name = cfg["workload"]["name"]
    strategies = tuple(module.STRATEGIES)
    require(cfg, "strategy.name", lambda v: v in strategies,
            f"one of {', '.join(strategies)} for workload={name} (choose with strategy=<name>)")
    from orchard.config import schema

    if "ray_log_level" in cfg["cluster"]:  # written in any case on the command line; Ray's names are upper case
        cfg["cluster"]["ray_log_level"] = str(cfg["cluster"]["ray_log_level"]).upper()
    schema.check(schema.Core, cfg)  # types and ranges (orchard/config/schema.py)
    if cfg["strategy"]["name"] == "ps":
        schema.check(schema.ParameterServers, cfg["strategy"], "strategy")
    if cfg["cluster"]["mode"] == "remote":
        schema.check(schema.RemoteCluster, cfg["cluster"], "cluster")
    validate_mode(cfg)  # mode / model / input (docs/models.md)
    if cfg["tracking"]["enabled"]:
        schema.check(schema.Tracking, cfg["tracking"], "tracking")
    validate_fn = getattr(module, "validate", None)
    if validate_fn is not None:
        validate_fn(cfg)


def check(cfg: dict, module) -> None:
    """The workload's own ``check``, what needs its heavy libraries (singa builds its net on two
    samples): the lifecycle runs it while Ray starts (``lifecycle.execute``); raises ``ConfigError``."""
    check_fn = getattr(module, "check", None)
    if check_fn is not None:
        check_fn(cfg)


def validate_mode(cfg: dict) -> None:
    """Top-level ``model``/``input`` of ``mode=predict`` (``mode`` itself: orchard/config/schema.py);
    raises ConfigError (one line, exit 2)."""
    if cfg["mode"] != "predict":
        return
    require(cfg, "model", lambda v: isinstance(v, str) and bool(v) and (
        v.startswith(MODEL_SCHEMES) or Path(os.path.expanduser(v)).exists()),
        "runs:/<run id>/model, models:/<name>/<version> or the path of a model folder (or a train run's folder)")
    require(cfg, "input", lambda v: v is not None, "a file or folder of inputs to predict on")
    require_path(cfg, "input", allow_none=False)
    if cfg.get("sweep"):
        raise ConfigError("sweep", "null with mode=predict (a sweep trains)")


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``: the MLflow params of a run."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def set_key(cfg: dict, key: str, value: Any) -> None:
    """Set a dotted key in a plain config dict (used by sweeps for trial values)."""
    node = cfg
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
