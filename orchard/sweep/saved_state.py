"""A sweep's identity and its saved Tune state: the key that names it, the folder and Tune path it
lives in, and the sealed copy of the state that a resume reads back (orchard/sweep/seal.py)."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Callable

from orchard.sweep import seal as sweep_seal
from orchard.terminal.console import say


# Overrides that say where a sweep runs and records, not what its trials compute: they do not
# change its identity, so e.g. the same sweep against another tracking server still resumes.
# How many trials run at once is not what they compute either.
AT_ONCE = ("max_concurrent_trials", "fit_gpu_memory")
NOT_IDENTITY = ("tracking", "output_dir", "storage", "cluster", "progress", "run_name", "hydra",
                *(f"sweep.{key}" for key in AT_ONCE))


# --------------------------------------------------------------------------- [1] identity
def identity_overrides(overrides: list[str]) -> list[str]:
    """The command's overrides that define the sweep, sorted (see ``NOT_IDENTITY``)."""
    kept = []
    for item in overrides:
        key = item.lstrip("+~").split("=", 1)[0]
        if not any(key == p or key.startswith(p + ".") for p in NOT_IDENTITY):
            kept.append(item)
    return sorted(kept)


def sweep_key(cfg: dict) -> str:
    """``<workload>-<sweep>-<digest>``: the same command gives the same key, another command
    another.  The digest covers the identity overrides and the search itself (an edited sweep
    file is a new sweep: Tune would resume the old search space)."""
    search = {k: v for k, v in cfg["sweep"].items() if k not in AT_ONCE}
    identity = {"overrides": identity_overrides(cfg.get("_overrides") or []), "search": search}
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{cfg['workload']['name']}-{cfg['sweep']['name']}-{digest}"


def sweep_dir(cfg: dict) -> Path:
    return Path(cfg["output_dir"]).resolve() / "sweeps" / sweep_key(cfg)


def tune_path(cfg: dict) -> str:
    """Tune's experiment folder: ``<storage root>/sweeps/<key>/tune`` (a URI with ``storage.uri``)."""
    from orchard.storage import Storage

    return Storage.root(cfg).child("sweeps", sweep_key(cfg), "tune").uri


def saved_state_of(cfg: dict):
    """Tune's experiment folder as a ``Storage``."""
    from orchard.storage import Storage

    return Storage(tune_path(cfg))


def restorable(cfg: dict) -> dict | None:
    """The sealed files of this sweep's saved Tune state, checked (orchard/sweep/seal.py), or
    None when Tune saved none; raises ``sweep_seal.Unsealed`` for state this user did not seal.
    Only a file's presence is asked before the check: Tune's ``can_restore`` reads no content."""
    from ray import tune

    if not tune.Tuner.can_restore(str(tune_path(cfg))):
        return None
    return sweep_seal.verify(saved_state_of(cfg))


def checked_state(check: Callable, cfg: dict, lease):
    """``check(cfg)``, giving the lease back if it raises (the sweep then touches nothing)."""
    try:
        return check(cfg)
    except BaseException:
        if lease is not None:
            lease.release()
        raise


def staging_of(trials: list) -> Path | None:
    """Tune's local copy of the experiment folder, written by this driver alone: what it uploads
    to storage (Ray's ``experiment_driver_staging_path``); None without trials."""
    try:
        return Path(trials[0].storage.experiment_driver_staging_path) if trials else None
    except Exception:
        return None


def seal_state(cfg: dict, sealed: dict | None, staging: Path | None) -> None:
    """Seal what this driver wrote: the files sealed before (those still there: Tune may remove
    some, never add one this way), ``tuner.pkl``, and Tune's staging copy."""
    if staging is None or not staging.is_dir():
        say("orchard: the sweep's Tune state could not be sealed (no staging copy): the same command "
            "will not resume it", file=sys.stderr)
        return
    state = saved_state_of(cfg)
    try:
        present = set(sweep_seal.stored_names(state))
        files = {rel: d for rel, d in (sealed or {}).items() if rel in present}
        sweep_seal.seal(state, {**files, **sweep_seal.local_digests(staging)})
    except (OSError, sweep_seal.Unsealed) as exc:
        say(f"orchard: the sweep's Tune state could not be sealed ({exc}): the same command will not "
            "resume it", file=sys.stderr)


def saved_statuses(staging: Path | None) -> dict[str, str]:
    """Trial id -> status in the experiment state Tune saved last (``{}`` if none could be read).
    Read from this driver's own staging copy with plain ``json``: Ray's ``ExperimentAnalysis``
    would unpickle the trials it holds."""
    try:
        newest = max(staging.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
        states = [json.loads(entry[0]) for entry in json.loads(newest.read_text())["trial_data"]]
        return {str(t["trial_id"]): str(t["status"]) for t in states}
    except Exception as exc:
        say(f"orchard: could not read the sweep's saved state: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {}
