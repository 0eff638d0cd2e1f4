"""``python -m orchard resume <run id>``: a KILLED or FAILED run continued from its last
checkpoint, as a new run tagged ``orchard.resumes``, through the single run's path
(``lifecycle.preflight``, ``open_console``, ``execute``). One resume of a run at a time
(``_lease``); a run still RUNNING whose driver is gone (same host, its process ended) is closed
first, as ``runs reap`` would. What it takes back from the store is an allow-list
(orchard/run/from_the_store.py): anything else the run recorded is given again after the id (as it
was, changed, or ``~key``: without it), or the resume stops, naming it."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from orchard.config import registry
from orchard.errors import ConfigError
from orchard.run import from_the_store
from orchard.run.lifecycle import execute, open_console, preflight, prepare
from orchard.terminal.console import say


def resume(run_id: str, extra: list[str]) -> int:
    """``python -m orchard resume <run id> [tracking.uri=...] [key=value ...]``: continue a KILLED or
    FAILED run from its last checkpoint, with the same config, as a new run tagged ``orchard.resumes``."""
    from orchard.tracking.store import DEFAULT_URI

    uri = next((a.split("=", 1)[1] for a in extra if a.startswith("tracking.uri=")), DEFAULT_URI)
    lease = None
    try:
        client, old = _stopped_run(run_id, uri)
        lease = _lease(client, old.info.run_id)
        cfg, module = _resume_config(old, uri, extra)
        preflight(cfg, module)
    except ConfigError as err:
        if lease is not None:
            lease.release()
        say(f"orchard: cannot resume: {err}", file=sys.stderr)
        return 2
    try:
        open_console(cfg)
        say(f"orchard: resuming run {old.info.run_id} as a new run", file=sys.stderr)
        return execute(cfg, module).exit_code
    finally:
        lease.release()


def _stopped_run(run_id: str, uri: str):
    """(client, the run) for a KILLED or FAILED run of the store at ``uri``; a RUNNING one whose
    driver is gone (``lost_runs.why_lost``: on this host, its process ended) is closed FAILED
    first, so a driver SIGKILLed a minute in needs no ``runs reap`` before its resume."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from orchard.tracking import lost_runs
    from orchard.tracking.store import check_store, resolve_uri

    check_store(uri, create=False)  # resume reads a store; it never makes one
    client = MlflowClient(resolve_uri(uri))
    try:
        old = client.get_run(run_id)
    except MlflowException:
        old = lost_runs.find_run_by_prefix(client, run_id, uri)
    run_id = old.info.run_id
    if old.info.status == "RUNNING":
        try:
            now = lost_runs.store_now(client.tracking_uri)
        except OSError:  # a server that gives no time: judged on this host's clock
            now = None
        reason = lost_runs.why_lost(old.data.tags, now)
        if reason is not None:
            lost_runs.close_lost(client, run_id, reason)
            say(f"orchard: run {run_id} was RUNNING, but {reason}; closed it FAILED", file=sys.stderr)
            old = client.get_run(run_id)
    if old.info.status not in ("KILLED", "FAILED"):
        tags = old.data.tags
        driver = (f", driven by pid {tags['orchard.pid']} on {tags.get('orchard.host')}"
                  if old.info.status == "RUNNING" and "orchard.pid" in tags else "")
        raise ConfigError("run id", f"a KILLED or FAILED run; {run_id} is {old.info.status}{driver}")
    return client, old


def _lease(client, run_id: str):
    """One resume of a run at a time (orchard/tracking/leases.py): a second one, here or on another
    machine, would train into the same checkpoints."""
    from orchard.tracking import leases

    try:
        return leases.take(client, run_id, f"the resume of run {run_id}")
    except leases.LeaseHeld as held:
        raise ConfigError("run id", str(held)) from None


def _recorded(tags: dict) -> list[str]:
    """The overrides the run recorded (``orchard.overrides``; before that tag: its command)."""
    if "orchard.overrides" in tags:
        try:
            items = json.loads(tags["orchard.overrides"])
        except ValueError:
            raise ConfigError("run id", "a run whose orchard.overrides tag is a JSON list; it is not") from None
    else:
        items = shlex.split(tags.get("orchard.command", ""))[3:]
    if not isinstance(items, list) or not all(isinstance(o, str) for o in items):
        raise ConfigError("run id", "a run whose orchard.overrides tag is a JSON list of key=value; it is not")
    return items


def _resume_config(old, uri: str, extra: list[str]):
    """The config of the new run: what the store may give back (orchard/run/from_the_store.py) and
    the command line (``~key``: go on without the recorded key); a ConfigError naming what the
    run recorded beyond that, to be given again."""
    from orchard import storage
    from orchard.run import divergence

    run_id, tags = old.info.run_id, old.data.tags
    same_again = divergence.resume_guard(tags, extra)
    if same_again:
        raise ConfigError("run id", same_again)
    left_out = [o for o in extra if o.startswith("~") and "=" not in o]
    given = [f"tracking.uri={uri}"] + [o for o in extra if not o.startswith("tracking.uri=") and o not in left_out]
    recorded = _recorded(tags)
    held = from_the_store.held_back(recorded, given + left_out)
    dirs = [d for d in json.loads(tags.get("orchard.config_dirs", "[]")) if d not in registry.user_config_dirs()]
    if dirs:  # a config folder is code of this machine: named, never added (a composition that needs it says so)
        say(f"orchard: not taken from the store: {', '.join(f'--config-dir {d}' for d in dirs)}; pass it again "
            "after the run id if the run needs it", file=sys.stderr)
    if held:
        keys = ", ".join(dict.fromkeys(from_the_store.key_of(o) for o in held))
        raise ConfigError(keys, "given on the command line: a resume takes back from the store only what the run "
                          "is (workload, its section, strategy, debug, experiment, seed), since anyone who can "
                          f"write the store could have planted the rest. The run recorded {' '.join(map(shlex.quote, held))}; "
                          "give each after the run id as it was or changed (key=value), or ~key to go on without "
                          f"it: python -m orchard resume {run_id} {shlex.quote(given[0])} ...")
    stated = {from_the_store.key_of(o) for o in given + left_out}  # the command line's word wins
    cfg, module = prepare([o for o in recorded if from_the_store.key_of(o) not in stated] + given)
    resume_fn = getattr(module, "resume", None)
    previous_dir = tags.get("orchard.run_dir")
    if resume_fn is None:
        raise ConfigError("workload", f"{cfg['workload']['name']} keeps no checkpoints to resume from; start it again")
    if not previous_dir or "://" in previous_dir or not (Path(previous_dir).is_dir()
                                                         or storage.run_kept(cfg, previous_dir)):
        raise ConfigError("run id", f"a run whose folder still exists; {previous_dir!r} is gone")
    try:
        resume_fn(cfg, previous_dir)  # the workload points its config at the previous run's checkpoint
    except OSError as exc:  # a bucket that cannot be reached: one line, not pyarrow's traceback
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError("storage.uri", f"a storage location that answers; reading {previous_dir}'s checkpoint: "
                          f"{first}") from None
    cfg["_resumes"] = run_id
    return cfg, module
