"""A sweep's search: its keys checked, Tune's param space, each trial's config and resources, and the
paths made absolute before Tune moves the trials' working folder (docs/sweeps.md)."""
from __future__ import annotations

import copy
from pathlib import Path

from orchard import config as config_lib
from orchard.errors import ConfigError


PARAM_TYPES = ("grid", "choice", "uniform", "loguniform", "randint")


def validate_sweep(cfg: dict) -> None:
    from orchard.config import schema

    s = cfg["sweep"]
    if "resources_per_trial" in s:
        raise ConfigError("sweep.resources_per_trial", "not a sweep key any more: a trial's resources come from the "
                          "workload's resources(cfg) (docs/sweeps.md); remove it")
    schema.check(schema.Sweep, s, "sweep")  # types and ranges (orchard/config/schema.py)
    if not s.get("params"):
        raise ConfigError("sweep.params", "at least one config key to search over")
    for key, spec in s["params"].items():
        try:
            config_lib.get(cfg, key)
        except ConfigError:
            raise ConfigError(f"sweep.params.{key}", "a key of the composed config (check its spelling)") from None
        if not isinstance(spec, dict) or spec.get("type") not in PARAM_TYPES:
            raise ConfigError(f"sweep.params.{key}.type", f"one of {', '.join(PARAM_TYPES)}")
        if spec["type"] in ("grid", "choice") and not spec.get("values"):
            raise ConfigError(f"sweep.params.{key}.values", "a non-empty list")
        if spec["type"] in ("uniform", "loguniform", "randint") and not ("low" in spec and "high" in spec):
            raise ConfigError(f"sweep.params.{key}", "low and high")


def param_space(params: dict) -> dict:
    from ray import tune

    space = {}
    for key, spec in params.items():
        kind = spec["type"]
        if kind == "grid":
            space[key] = tune.grid_search(list(spec["values"]))
        elif kind == "choice":
            space[key] = tune.choice(list(spec["values"]))
        elif kind == "uniform":
            space[key] = tune.uniform(float(spec["low"]), float(spec["high"]))
        elif kind == "loguniform":
            space[key] = tune.loguniform(float(spec["low"]), float(spec["high"]))
        else:
            space[key] = tune.randint(int(spec["low"]), int(spec["high"]))
    return space


def trial_count(s: dict) -> int:
    """How many trials the sweep runs: ``num_samples`` draws of every grid point."""
    points = 1
    for spec in s["params"].values():
        if spec["type"] == "grid":
            points *= len(spec["values"])
    return int(s["num_samples"]) * points


def trial_config(base: dict, values: dict) -> dict:
    cfg = copy.deepcopy(base)
    for key, value in values.items():
        config_lib.set_key(cfg, key, value)
    return cfg


def anchored(cfg: dict) -> dict:
    """``cfg`` with every place a trial writes made absolute in the driver's working directory.

    Ray Tune runs each trial in a folder of its own (``<ray tmp>/session_*/tune/working_dirs/
    <trial>/``): there, the default ``sqlite:///mlflow.db`` was a new, empty store (the trial could
    not find its parent run: every trial failed) and ``outputs`` a folder nobody looks in (each
    trial made its own data cache). Anchored, trials record into the user's store and keep their
    run folders beside single runs in ``output_dir``, sharing its data caches."""
    import os

    from orchard.storage import is_uri
    from orchard.tracking.store import resolve_uri

    def here(path) -> str:
        return str(Path(os.path.expanduser(str(path))).resolve())

    out = copy.deepcopy(cfg)
    tracking = out["tracking"]
    if tracking.get("uri"):
        tracking["uri"] = resolve_uri(tracking["uri"])
    if tracking.get("artifact_location") and not is_uri(tracking["artifact_location"]) \
            and not str(tracking["artifact_location"]).startswith("file:"):
        tracking["artifact_location"] = here(tracking["artifact_location"])
    out["output_dir"] = here(out["output_dir"])
    if (out.get("storage") or {}).get("uri") and not is_uri(out["storage"]["uri"]):
        out["storage"]["uri"] = here(out["storage"]["uri"])
    return out


# --------------------------------------------------------------------------- [2] resources
def trial_resources(cfg: dict, module):
    """What one trial holds: the workload's ``resources(cfg)``; a workload that does not say is
    taken to run its tasks in one CPU of the trial's own reservation."""
    from orchard.cluster.placement import Resources, bundles

    fn = getattr(module, "resources", None)
    return fn(cfg) if fn is not None else Resources(in_trial=bundles(1, 1.0))
