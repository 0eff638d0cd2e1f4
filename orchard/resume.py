"""``python -m orchard resume <run id>``: a KILLED or FAILED run continued from its last
checkpoint, as a new run tagged ``orchard.resumes``, through the single run's path
(``lifecycle.preflight``, ``open_console``, ``execute``). What it takes from the store is
filtered first: nothing that names code or environments, no masked secret (``_trusted``); one
resume of a run at a time (``_lease``)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from orchard import redact, registry
from orchard.console import say
from orchard.errors import ConfigError
from orchard.lifecycle import execute, open_console, prepare, preflight


def resume(run_id: str, extra: list[str]) -> int:
    """``python -m orchard resume <run id> [tracking.uri=...]``: continue a KILLED or FAILED run
    from its last checkpoint, with the same config, as a new run tagged ``orchard.resumes``."""
    uri = next((a.split("=", 1)[1] for a in extra if a.startswith("tracking.uri=")), "sqlite:///mlflow.db")
    try:
        cfg, module = _resume_config(run_id, uri, extra)
        preflight(cfg)
        lease = _lease(cfg)
    except ConfigError as err:
        say(f"orchard: cannot resume: {err}", file=sys.stderr)
        return 2
    try:
        open_console(cfg)
        say(f"orchard: resuming run {run_id} as a new run", file=sys.stderr)
        return execute(cfg, module).exit_code
    finally:
        lease.release()


def _lease(cfg: dict):
    """One resume of a run at a time (orchard/leases.py): a second one, here or on another
    machine, would train into the same checkpoints."""
    from mlflow.tracking import MlflowClient

    from orchard import leases
    from orchard.tracking.store import resolve_uri

    previous = cfg["_resumes"]
    try:
        return leases.take(MlflowClient(resolve_uri(cfg["tracking"]["uri"])), previous, f"the resume of run {previous}")
    except leases.LeaseHeld as held:
        raise ConfigError("run id", str(held)) from None


# What a resume never takes from the store (whoever can write a tag there could plant it): code
# that would run on the resumer's machine or cluster. The command line gives it again, or not.
NOT_FROM_THE_STORE = ("cluster.runtime_env", "hydra.", "singa.layer_modules", "video.extractor_modules")


def _trusted(recorded: list[str], extra: list[str], config_dirs: list[str]) -> tuple[list[str], list[str]]:
    """The recorded overrides a resume re-runs, and what it leaves out: masked secrets
    (orchard/redact.py), keys that name code or environments (``NOT_FROM_THE_STORE``) and config
    folders, unless the user passes the key (or ``--config-dir``) again."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in extra}
    kept, dropped = [], []
    for item in recorded:
        key = item.split("=", 1)[0].lstrip("+~")
        if key in given:
            continue  # the command line's value wins
        if redact.MASK in item or key.startswith(NOT_FROM_THE_STORE):
            dropped.append(key)
        else:
            kept.append(item)
    dropped += [f"--config-dir {folder}" for folder in config_dirs if folder not in registry.user_config_dirs()]
    return kept, dropped


def _resume_config(run_id: str, uri: str, extra: list[str]):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from orchard.tracking.store import check_store, resolve_uri

    check_store(uri, create=False)  # resume reads a store; it never makes one
    client = MlflowClient(resolve_uri(uri))
    try:
        old = client.get_run(run_id)
    except MlflowException:
        from orchard.tracking.lost_runs import find_run_by_prefix

        old = find_run_by_prefix(client, run_id, uri)
    run_id = old.info.run_id
    if old.info.status not in ("KILLED", "FAILED"):
        tags = old.data.tags
        driver = (f", driven by pid {tags['orchard.pid']} on {tags.get('orchard.host')}"
                  if old.info.status == "RUNNING" and "orchard.pid" in tags else "")
        raise ConfigError("run id", f"a KILLED or FAILED run; {run_id} is {old.info.status}{driver}")
    tags = old.data.tags
    from orchard import divergence

    same_again = divergence.resume_guard(tags, extra)
    if same_again:
        raise ConfigError("run id", same_again)
    if "orchard.overrides" in tags:
        overrides = json.loads(tags["orchard.overrides"])
    else:  # runs from before the overrides tag: the recorded command
        overrides = shlex.split(tags.get("orchard.command", ""))[3:]
    overrides = [o for o in overrides if not o.startswith("tracking.uri=")]
    overrides, dropped = _trusted(overrides, extra, json.loads(tags.get("orchard.config_dirs", "[]")))
    if dropped:
        say(f"orchard: not taken from the store: {', '.join(dropped)}; pass what you want again after the run id "
            "(key=value, --config-dir DIR)", file=sys.stderr)
    overrides += [f"tracking.uri={uri}"] + [o for o in extra if not o.startswith("tracking.uri=")]
    cfg, module = prepare(overrides)
    from orchard import storage

    resume_fn = getattr(module, "resume", None)
    previous_dir = tags.get("orchard.run_dir")
    if resume_fn is None:
        raise ConfigError("workload", f"{cfg['workload']['name']} keeps no checkpoints to resume from; start it again")
    if not previous_dir or not (Path(previous_dir).is_dir() or storage.run_kept(cfg, previous_dir)):
        raise ConfigError("run id", f"a run whose folder still exists; {previous_dir!r} is gone")
    resume_fn(cfg, previous_dir)  # the workload points its config at the previous run's checkpoint
    cfg["_resumes"] = run_id
    return cfg, module
