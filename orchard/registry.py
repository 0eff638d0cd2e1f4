"""Workload registry: name -> module path, imported lazily.

Built-in workloads live in ``workloads/``.  Outside code registers its own either by calling
``register_workload`` before the CLI runs, or through the ``orchard.workloads`` entry-point
group (``name = "package.module"``); a module may expose ``CONFIG_DIR`` (a folder holding
``workload/<name>.yaml``) that orchard adds to Hydra's search path.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from types import ModuleType

_WORKLOADS: dict[str, str] = {
    "flower": "workloads.flower",
    "forest": "workloads.forest",
    "singa": "workloads.singa",
    "video": "workloads.video",
}
_CONFIG_DIRS: list[str] = []
_USER_DIRS: list[str] = []
_entry_points_loaded = False


def register_workload(name: str, module: str, config_dir: str | None = None) -> None:
    """Make ``workload=<name>`` run ``module.run``; ``config_dir`` holds ``workload/<name>.yaml``."""
    _WORKLOADS[name] = module
    if config_dir and config_dir not in _CONFIG_DIRS:
        _CONFIG_DIRS.append(str(config_dir))


def add_config_dir(path: str) -> None:
    """Hydra's ``--config-dir``: a user's own folder of config groups (``experiment/``, ``sweep/``,
    ``workload/`` presets ...) searched after orchard's own ``conf/``."""
    path = str(path)
    if path not in _USER_DIRS:
        _USER_DIRS.append(path)
    if path not in _CONFIG_DIRS:
        _CONFIG_DIRS.append(path)


def user_config_dirs() -> list[str]:
    """The folders given with ``--config-dir`` in this process (recorded with each run for resume)."""
    return list(_USER_DIRS)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group="orchard.workloads"):
        module = importlib.import_module(ep.value)
        register_workload(ep.name, ep.value, getattr(module, "CONFIG_DIR", None))


def names() -> list[str]:
    _load_entry_points()
    return sorted(_WORKLOADS)


def module_names() -> list[str]:
    """The Python module of every registered workload (what a cluster must be shipped)."""
    _load_entry_points()
    return sorted(set(_WORKLOADS.values()))


def extra_config_dirs() -> list[str]:
    _load_entry_points()
    return list(_CONFIG_DIRS)


def load(name: str) -> ModuleType:
    """Import the workload module; it must define ``run(cfg, ctx)`` and ``STRATEGIES``."""
    _load_entry_points()
    if name not in _WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; registered: {', '.join(names())}")
    module = importlib.import_module(_WORKLOADS[name])
    for attr in ("run", "STRATEGIES"):
        if not hasattr(module, attr):
            raise TypeError(f"workload module {module.__name__} lacks {attr}")
    return module
