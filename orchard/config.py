"""Config composition (Hydra 1.3) and validation, all before Ray starts.

Everything past this module sees plain dicts: ``compose`` returns the resolved config as a
container, so Ray, Tune, MLflow and workers never import Hydra.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from orchard import registry
from orchard.cluster import LIBRARY_LOG_LEVELS
from orchard.errors import ConfigError

GROUPS = ("workload", "strategy", "cluster", "tracking", "sweep", "experiment", "debug")


def conf_dir() -> Path:
    """The shipped ``conf/`` folder: beside the package in a checkout, inside it in a wheel."""
    here = Path(__file__).resolve().parent
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


def compose(overrides: Iterable[str] = (), return_hydra: bool = False) -> dict:
    """Compose ``conf/config.yaml`` with command-line style overrides into a plain dict.

    Raises ``ConfigError`` (one line) for unknown keys, unknown group options and bad values.
    """
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    overrides = [*overrides, *searchpath_override()]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=overrides, return_hydra_config=return_hydra)
            choices = dict(cfg.hydra.runtime.choices) if return_hydra else None
            run_dir = (OmegaConf.select(cfg, "hydra.run.dir")
                       if return_hydra and any(o.startswith("hydra.run.dir=") for o in overrides) else None)
            if return_hydra:
                with open_dict(cfg):
                    del cfg["hydra"]
            plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingConfigException as exc:
        raise _missing_option(str(exc)) from None
    except ConfigCompositionException as exc:
        raise _composition_error(exc) from None
    except OverrideParseException as exc:
        raise ConfigError("overrides", f"cannot parse: {str(exc).splitlines()[0]}") from None
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(str(key), str(exc).splitlines()[0]) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc) from None
    finally:
        GlobalHydra.instance().clear()
    if choices is not None:
        plain["_choices"] = {k: v for k, v in choices.items() if not k.startswith("hydra")}
    if run_dir:  # hydra.run.dir=DIR names the run's folder, as in a @hydra.main app
        plain["_run_dir"] = str(run_dir)
    return plain


def hydra_node(overrides: Iterable[str]) -> dict:
    """The ``hydra`` part of a composition (``--cfg hydra``), unresolved as Hydra prints it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=[*overrides, *searchpath_override()], return_hydra_config=True)
            return OmegaConf.to_container(cfg.hydra, resolve=False)
    finally:
        GlobalHydra.instance().clear()


def _yaml_error(exc) -> ConfigError:
    """A YAML syntax error in a config file: the file and line, not Hydra's 100-line traceback."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return ConfigError("config file", f"valid YAML; {problem}")
    return ConfigError(f"{mark.name}:{mark.line + 1}", f"valid YAML; {problem} (line {mark.line + 1}, column {mark.column + 1})")


def _missing_option(message: str) -> ConfigError:
    m = re.search(r"Could not find '([\w/]+)/([^']*)'", message)
    if m:
        group, value = m.group(1), m.group(2)
        return ConfigError(group, f"one of {', '.join(group_options(group))}; got {value!r}")
    m = re.search(r"You must specify '(\w+)'", message)
    if m:
        group = m.group(1)
        return ConfigError(group, f"required: {group}=<one of {', '.join(group_options(group))}>")
    return ConfigError("config", message.splitlines()[0])


def _composition_error(exc: Exception) -> ConfigError:
    message = str(exc)
    if "You must specify" in message:
        return _missing_option(message)
    m = re.search(r"Could not override '([^']+)'", message)
    cause = exc.__cause__
    if m:
        key = m.group(1)
        if cause is not None and "not in struct" in str(cause):
            return ConfigError(key, "no such config key" + _did_you_mean(key) + f" (to add a new key on purpose: +{key}=...)")
        if cause is not None:
            return ConfigError(key, str(cause).splitlines()[0])
        return ConfigError(key, message.splitlines()[-1])
    m = re.search(r"Could not append to config. An item is already at '([^']+)'", message)
    if m:
        return ConfigError(m.group(1), "already exists; drop the leading '+' to override it")
    if cause is not None:
        return ConfigError(str(getattr(cause, "full_key", "config") or "config"), str(cause).splitlines()[0])
    return ConfigError("config", message.splitlines()[0])


def _did_you_mean(key: str) -> str:
    """Suggest the closest existing key to a typo'd one, using the default composition."""
    try:
        parent, _, leaf = key.rpartition(".")
        known = _known_keys(parent)
    except Exception:  # a suggestion is a courtesy; never let it hide the real error
        return ""
    close = difflib.get_close_matches(leaf, known, n=1)
    if close:
        return f"; did you mean {parent + '.' if parent else ''}{close[0]}?"
    if known:
        return f"; keys here: {', '.join(sorted(known)[:12])}"
    return ""


_LAST_CFG: dict | None = None


def _known_keys(parent: str) -> list[str]:
    node: Any = _LAST_CFG or {}
    for part in filter(None, parent.split(".")):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return list(node) if isinstance(node, dict) else []


def compose_with_hints(overrides: Iterable[str]) -> dict:
    """``compose`` that can name the closest key when an override has a typo."""
    global _LAST_CFG
    overrides = list(overrides)
    try:
        return compose(overrides, return_hydra=True)
    except ConfigError as err:
        if "no such config key" not in err.allowed:
            raise
        # Compose again without the bad key so the hint can list the keys that do exist.
        good = [o for o in overrides if not o.lstrip("+~").startswith(err.key + "=")]
        try:
            _LAST_CFG = compose(good)
        except ConfigError:
            raise err from None
        raise ConfigError(err.key, "no such config key" + _did_you_mean(err.key)
                          + f" (to add a new key on purpose: +{err.key}=...)") from None


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
    require_positive(cfg, "strategy.num_workers", integer=True)
    require(cfg, "strategy.cpus_per_worker", lambda v: v >= 0, "a number >= 0")
    require(cfg, "strategy.gpus_per_worker", lambda v: v >= 0, "a number >= 0")
    require(cfg, "strategy.max_failures", lambda v: isinstance(v, int) and v >= -1, "an integer >= -1 (-1: retry forever)")
    if cfg["strategy"]["name"] == "ps":
        require_positive(cfg, "strategy.num_servers", integer=True)
        require_choice(cfg, "strategy.mode", ("sync", "async"))
        if "async_average" in cfg["strategy"]:
            require(cfg, "strategy.async_average", lambda v: isinstance(v, bool), "true or false")
    require_choice(cfg, "cluster.mode", ("local", "remote"))
    if "ray_log_level" in cfg["cluster"]:
        cfg["cluster"]["ray_log_level"] = str(cfg["cluster"]["ray_log_level"]).upper()
        require_choice(cfg, "cluster.ray_log_level", LIBRARY_LOG_LEVELS)
    if cfg["cluster"].get("worker_start_timeout_s") is not None:
        require_positive(cfg, "cluster.worker_start_timeout_s")
    if cfg["cluster"]["mode"] == "remote":
        require(cfg, "cluster.address", lambda v: v == "auto" or str(v).startswith(("ray://", "http")) or ":" in str(v),
                "auto, ray://host:10001 or host:6379")
    require_choice(cfg, "progress", ("auto", "always", "never"))
    from orchard.models import validate_mode

    validate_mode(cfg)  # mode / model / input (docs/models.md)
    require_choice(cfg, "verbose", (True, False))
    if cfg["tracking"]["enabled"]:
        require(cfg, "tracking.uri", lambda v: bool(re.match(r"^(sqlite|http|https|file|postgresql|mysql|databricks)[:+]", str(v))),
                "an MLflow tracking URI such as sqlite:///mlflow.db or http://127.0.0.1:5000")
        require_positive(cfg, "tracking.sample_interval_s")
    validate_fn = getattr(module, "validate", None)
    if validate_fn is not None:
        validate_fn(cfg)


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
