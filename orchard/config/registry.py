"""Workload registry: name -> module path, imported lazily.

Built-in workloads live in ``workloads/``.  Outside code registers its own either by calling
``register_workload`` before the CLI runs, or through the ``orchard.workloads`` entry-point
group (``name = "package.module"``); a module may expose ``CONFIG_DIR`` (a folder holding
``workload/<name>.yaml``) that orchard adds to Hydra's search path.
"""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType

_WORKLOADS: dict[str, str] = {
    "flower": "workloads.flower",
    "forest": "workloads.forest",
    "singa": "workloads.singa",
    "video": "workloads.video",
}
# The packages each built-in workload's extra installs (pyproject's optional-dependencies), by
# import name: `pip install orchard` is the core, `orchard[video]` adds what workload=video imports.
EXTRAS: dict[str, tuple[str, ...]] = {
    "flower": ("torch", "PIL", "cv2", "skimage"),
    "forest": ("numba", "cv2"),
    "singa": ("torch", "cv2", "sklearn", "pandas"),
    "video": ("torch", "av", "cv2"),
}
_CONFIG_DIRS: list[str] = []
PREDICTIONS_DIR = "predictions"  # a predict run's outputs, in its folder and among its artifacts
_USER_DIRS: list[str] = []
_entry_points_loaded = False


def register_workload(name: str, module: str, config_dir: str | None = None) -> None:
    """Make ``workload=<name>`` run ``module`` (its ``run.py``, or its own ``run``: ``entry``); ``config_dir`` holds ``workload/<name>.yaml``."""
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
    """Import the workload module; it must define ``STRATEGIES`` and an entry (``entry``)."""
    _load_entry_points()
    if name not in _WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; registered: {', '.join(names())}")
    missing = missing_extra(name)
    if missing:  # the workloads import these lazily: say so here, before anything starts
        from orchard.errors import ConfigError

        raise ConfigError(f"workload={name}", f'needs pip install "orchard[{name}]" (not installed: {", ".join(missing)})')
    module = importlib.import_module(_WORKLOADS[name])
    if not hasattr(module, "STRATEGIES"):
        raise TypeError(f"workload module {module.__name__} lacks STRATEGIES")
    is_package = hasattr(module, "__path__")
    if not (_own_run(module) or (is_package and importlib.util.find_spec(f"{module.__name__}.run"))):
        raise TypeError(f"workload module {module.__name__} has neither run.py nor run(cfg, ctx)")
    return module


def missing_extra(name: str) -> list[str]:
    """The packages of a built-in workload's extra that cannot be imported here (none for a
    workload registered from outside, or a built-in name registered again to another module)."""
    if _WORKLOADS.get(name) != f"workloads.{name}":
        return []
    return [package for package in EXTRAS.get(name, ()) if not _importable(package)]


def _importable(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a module set to None
        return False


def _own_run(module):
    """A single-module workload's own ``run(cfg, ctx)`` (it serves both modes), else None.
    In a package that follows the anatomy, ``module.run`` is the ``run.py`` submodule once imported."""
    fn = getattr(module, "run", None)
    return fn if callable(fn) and not isinstance(fn, ModuleType) else None


def entry(module: ModuleType, mode: str) -> Callable[[dict, object], dict]:
    """The function a run of ``mode`` calls with ``(cfg, ctx)``.  A workload package (the anatomy,
    docs/architecture.md): ``run.py``'s ``run(cfg, ctx)`` to train, and for ``mode=predict``
    ``predict.py``'s ``predict(cfg, ctx, out)``, where ``out`` is the predictions folder the core
    opens and renames into place once the run has written it whole (a run that fails leaves no
    partial folder: orchard.storage.atomic_folder).  A single-module workload's own ``run``."""
    own = _own_run(module)
    if own is not None:
        return own
    if mode != "predict":
        return importlib.import_module(f"{module.__name__}.run").run
    predict = importlib.import_module(f"{module.__name__}.predict").predict

    def into_predictions_folder(cfg: dict, ctx) -> dict:
        from pathlib import Path

        from orchard.storage import atomic_folder

        with atomic_folder(Path(ctx.run_dir) / PREDICTIONS_DIR) as out:
            out.mkdir(parents=True)
            return predict(cfg, ctx, out)

    return into_predictions_folder
