"""The one door: everything a workload may use from orchard's core, and nothing else.

A workload (``workloads/<name>/``, or a user's package registered with ``register_workload``)
imports the core only as ``from orchard.api import <name>``; a test keeps it so
(tests/orchard/test_api.py).  The table below names each part and where it lives; a name is
imported when first asked for, so a workload's config and schema modules stay light (no Ray,
no torch) for the CLI's exit-2 paths.  docs/design/contract.md is checked against this table.
"""
from __future__ import annotations

import importlib

# name -> "module" (the module itself, used as a namespace) or "module:attribute"
DOOR: dict[str, str] = {
    # config: one-line errors, the keys' checks, the workload's schema section
    "ConfigError": "orchard.errors:ConfigError",
    "Diverged": "orchard.errors:Diverged",
    "require": "orchard.config:require",
    "require_choice": "orchard.config:require_choice",
    "require_path": "orchard.config:require_path",
    "conf_dir": "orchard.config:conf_dir",
    "schema": "orchard.config.schema",
    "Section": "orchard.config.schema:Section",
    "positive_int": "orchard.config.schema:positive_int",
    # storage: the one location every node reads and writes, whole writes
    "Storage": "orchard.storage:Storage",
    "StorageFull": "orchard.storage:StorageFull",
    "is_uri": "orchard.storage:is_uri",
    "read_file": "orchard.storage:read_file",
    "write_file": "orchard.storage:write_file",
    "file_exists": "orchard.storage:file_exists",
    "write_atomic": "orchard.storage:write_atomic",
    "atomic_folder": "orchard.storage:atomic_folder",
    "partial_name": "orchard.storage:partial_name",
    "evicted_bytes": "orchard.storage:evicted_bytes",
    # bad inputs: skipped, named and counted by kind
    "skipped": "orchard.tracking.skipped",
    "SkippedFile": "orchard.tracking.skipped:SkippedFile",
    "LeavesFolder": "orchard.tracking.skipped:LeavesFolder",
    "kind_of": "orchard.tracking.skipped:kind_of",
    "one_line": "orchard.tracking.skipped:one_line",
    "inside_folder": "orchard.tracking.skipped:inside_folder",
    "listed_inputs": "orchard.tracking.skipped:listed_inputs",
    "too_many_skipped": "orchard.tracking.skipped:too_many_skipped",
    # divergence: the one finiteness check of every training loop
    "divergence": "orchard.run.divergence",
    "non_finite": "orchard.run.divergence:non_finite",
    "check_weights": "orchard.run.divergence:check_weights",
    "word": "orchard.run.divergence:word",
    # models: the MLflow Model a run logs, and batch prediction over an actor pool
    "models": "orchard.models",
    "save_model": "orchard.models:save_model",
    "save_pyfunc": "orchard.models:save_pyfunc",
    "free_dims": "orchard.models:free_dims",
    "pip_requirements": "orchard.models:pip_requirements",
    "batch_predict": "orchard.models.batch_predict",
    # figures: the headless pyplot, and a metric's history as a series
    "pyplot": "orchard.tracking.figures:pyplot",
    "logged_series": "orchard.tracking.figures:logged_series",
    "drawn_png": "orchard.tracking.figures:drawn_png",
    # placement: what one run holds, as Ray placement-group bundles
    "Resources": "orchard.cluster.placement:Resources",
    "bundles": "orchard.cluster.placement:bundles",
    # strategies: Ray Train ring groups, parameter servers, and surviving a lost node
    "launch": "orchard.strategies.launch:launch",
    "worker": "orchard.strategies.worker",
    "PSClient": "orchard.strategies.ps:PSClient",
    "PSGroup": "orchard.strategies.ps:PSGroup",
    "payload_bytes": "orchard.strategies.ps:payload_bytes",
    "NumpyOptimizer": "orchard.strategies.optimizers:NumpyOptimizer",
    "NodeWatch": "orchard.strategies.node_loss:NodeWatch",
    "Rebuilds": "orchard.strategies.node_loss:Rebuilds",
    "NotPlaced": "orchard.strategies.node_loss:NotPlaced",
    "get_all": "orchard.strategies.node_loss:get_all",
    "on_this_node": "orchard.strategies.node_loss:on_this_node",
    "start_bound_s": "orchard.strategies.node_loss:start_bound_s",
    # actors ended for good: a kill that Ray ignored during a restart, seen through
    "kill_and_confirm": "orchard.cluster.actors:kill_and_confirm",
    # background threads that stop with the run
    "background": "orchard.background",
    # the console: a line to the terminal and the run's log (a run's own warnings, on the driver)
    "say": "orchard.terminal.console:say",
    # Ray's internals that orchard wraps in one place (its Ray Data logging, a private temp folder)
    "data_execution_callback_class": "orchard.cluster.ray_private:data_execution_callback_class",
    "private_tmp": "orchard.storage.private_tmp:private_tmp",
}
__all__ = sorted(DOOR)


def __getattr__(name: str):
    where = DOOR.get(name)
    if where is None:
        raise AttributeError(f"orchard.api has no {name!r}: a workload uses the core through the names in "
                             f"orchard.api.DOOR (docs/design/contract.md)")
    module, _, attr = where.partition(":")
    value = importlib.import_module(module)
    value = getattr(value, attr) if attr else value
    globals()[name] = value   # once: later lookups find it directly
    return value


def __dir__() -> list[str]:
    return __all__
