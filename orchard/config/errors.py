"""Hydra's composition failures as orchard's one line, built from what Hydra hands over as data.

The overrides are parsed with Hydra's own ``OverridesParser`` (a syntax error names the
override), a missing config file comes as ``MissingConfigException`` (its group, option and the
options there are), a bad key or value as the OmegaConf error it wraps (its ``full_key``), and
whatever Hydra raises without such data is located by composing again without the key overrides
and checking each against that config. Nothing here reads Hydra's message text, so Hydra can
reword its messages without changing orchard's.
"""
from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from orchard.errors import ConfigError

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def parse(overrides: Iterable[str], config_loader=None) -> list:
    """Hydra's ``Override`` objects for ``overrides``; a syntax error names the override.

    ``config_loader`` (inside a Hydra context) lets ``glob(...)`` sweeps list a group's options."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create(config_loader=config_loader)
    parsed = []
    for item in overrides:  # one at a time, so the error names the one that does not parse
        try:
            parsed.extend(parser.parse_overrides([item]))
        except OverrideParseException as exc:
            key = item.split("=", 1)[0] if "=" in item else item
            what = ("a key=value override; a flag orchard does not know (python -m orchard --hydra-help lists them)"
                    if item.startswith("-") else f"a key=value override in Hydra's grammar ({GRAMMAR}); "
                    "quote a value with spaces or brackets")
            raise ConfigError(key, f"{what}; got {exc.override!r}") from None
    return parsed


def is_group(override, config_dirs: list[Path]) -> bool:
    """Whether an override picks a config group option (``workload=singa``, ``singa/arch=x``)
    rather than setting a key: its name is a folder of the search path (or Hydra's own)."""
    name = override.key_or_group
    return name.startswith("hydra/") or any((folder / name).is_dir() for folder in config_dirs)


def missing_config(exc, group_options: Callable[[str], list[str]]) -> ConfigError:
    """``MissingConfigException``: a group option (or a file a defaults list names) not found."""
    group, _, option = (exc.missing_cfg_file or "").rpartition("/")
    if not group:
        return ConfigError("config", f"an existing config file; {exc.missing_cfg_file!r} is not one")
    options = list(exc.options or []) or group_options(group)
    return ConfigError(group, f"one of {', '.join(options)}; got {option!r}")


def from_omegaconf(cause) -> ConfigError | None:
    """The OmegaConf error a ``ConfigCompositionException`` wraps, if it names its key."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    key = getattr(cause, "full_key", None)
    if not key:
        return None
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None  # an unknown key: the caller adds the keys that do exist (``unknown_key``)
    return ConfigError(str(key), str(cause).splitlines()[0])


def unknown_key_name(cause) -> str | None:
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
        return str(cause.full_key)
    return None


def unknown_key(key: str, known: dict) -> ConfigError:
    """``key`` is in no config: name the closest key that is, and how to add one on purpose."""
    return ConfigError(key, "no such config key" + did_you_mean(key, known) + f" (to add a new key on purpose: +{key}=...)")


def did_you_mean(key: str, known: dict) -> str:
    parent, _, leaf = key.rpartition(".")
    node = known
    for part in filter(None, parent.split(".")):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    siblings = list(node) if isinstance(node, dict) else []
    close = difflib.get_close_matches(leaf, siblings, n=1)
    if close:
        return f"; did you mean {parent + '.' if parent else ''}{close[0]}?"
    # one level down or more: flower.lrr -> flower.optimizer.lr
    deeper = {path.rpartition(".")[2]: path for path in _paths(node, parent)}
    close = difflib.get_close_matches(leaf, list(deeper), n=1)
    if close:
        return f"; did you mean {deeper[close[0]]}?"
    if siblings:
        return f"; keys here: {', '.join(sorted(siblings)[:12])}"
    return ""


def locate(parsed: list, base: dict) -> ConfigError | None:
    """The first key override that cannot apply to ``base`` (the config composed with the group
    overrides only), checked as Hydra applies them: ``+key`` must be new, ``~key`` and ``key``
    must exist."""
    from hydra.core.override_parser.types import OverrideType

    for override in parsed:
        key = override.key_or_group
        exists = _has(base, key)
        if override.type == OverrideType.ADD and exists and not isinstance(override.value(), (dict, list)):
            return ConfigError(key, f"already exists; drop the leading '+' to override it (or ++{key}=... to add or override)")
        if override.type == OverrideType.DEL and not exists:
            return ConfigError(key, "no such config key to delete" + did_you_mean(key, base))
        if override.type == OverrideType.CHANGE and not exists:
            return unknown_key(key, base)
    return None


def required_groups(root_config: Path) -> list[str]:
    """The groups the root defaults list marks ``???``: the command line must pick them."""
    return list(_required_groups(str(root_config)))


@lru_cache(maxsize=None)
def _required_groups(path: str) -> tuple[str, ...]:
    import yaml

    defaults = (yaml.safe_load(Path(path).read_text()) or {}).get("defaults") or []
    return tuple(k for item in defaults if isinstance(item, dict) for k, v in item.items() if v == "???")


def _paths(node: dict, prefix: str):
    """Every dotted key nested below ``node``'s own keys (those are matched first)."""
    for name, child in node.items():
        if isinstance(child, dict):
            here = f"{prefix}.{name}" if prefix else str(name)
            yield from (f"{here}.{sub}" for sub in child)
            yield from _paths(child, here)


def _has(cfg: dict, key: str) -> bool:
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
