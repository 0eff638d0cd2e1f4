"""Runs whose driver died without a word: a heartbeat while a run lives, a reaper after.

MLflow cannot tell a run that is training from one whose driver was SIGKILLed, ran out of
memory or lost power: both say RUNNING forever (mlflow#3932).  So every orchard run carries
who drives it (host, boot id, pid and the pid's start time) and a heartbeat tag that the
driver refreshes every ``HEARTBEAT_S`` seconds.  A RUNNING run is *lost* when

- its driver was on this machine (same host name and boot id) and that process is gone, or
- its heartbeat is older than ``LOST_AFTER_S`` (a driver on another machine, or on this one
  before a reboot).

Every orchard start closes lost runs as FAILED with the reason "driver lost"
(``reap``); ``python -m orchard runs reap`` does the same on demand and ``runs list`` shows
what is open.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

HEARTBEAT_S = 10.0
LOST_AFTER_S = 120.0
TAG_HEARTBEAT = "orchard.heartbeat"
LOST_REASON = "driver lost: its process ended without closing the run (SIGKILL, out of memory or power loss)"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _process_start(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def driver_tags() -> dict[str, str]:
    """Who drives a run: set when the run is created, so even a run cut off at once is reapable."""
    pid = os.getpid()
    return {"orchard.host": socket.gethostname(), "orchard.boot_id": _boot_id(), "orchard.pid": str(pid),
            "orchard.pid_start": f"{_process_start(pid) or 0:.3f}", TAG_HEARTBEAT: f"{time.time():.0f}"}


class Heartbeat:
    """Refreshes the run's heartbeat tag from a daemon thread until ``stop()``."""

    def __init__(self, client, run_id: str, interval_s: float = HEARTBEAT_S):
        self.client, self.run_id, self.interval = client, run_id, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="orchard-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.client.set_tag(self.run_id, TAG_HEARTBEAT, f"{time.time():.0f}")
            except Exception:  # a store hiccup must not end the run; the next beat retries
                pass

    def stop(self) -> None:
        self._stop.set()


def why_lost(tags: dict, now: float | None = None) -> str | None:
    """The reason a RUNNING run's driver is gone, or None while it may be alive."""
    now = time.time() if now is None else now
    if TAG_HEARTBEAT not in tags:
        return None  # not an orchard run (or from before heartbeats): leave it alone
    # Same machine (host name and boot id): the process table is the truth.  Anything else (another
    # machine, or this one rebooted: a power loss) is judged by the heartbeat's age.
    if tags.get("orchard.host") == socket.gethostname() and tags.get("orchard.boot_id") == _boot_id():
        pid = int(tags.get("orchard.pid", "0") or 0)
        started = _process_start(pid) if pid else None
        if started is None or abs(started - float(tags.get("orchard.pid_start", "0") or 0)) > 1.0:
            return LOST_REASON
        return None
    if now - float(tags[TAG_HEARTBEAT]) > LOST_AFTER_S:
        return LOST_REASON + f"; no heartbeat for over {LOST_AFTER_S:.0f} s"
    return None


def all_runs(client, filter_string: str = ""):
    """Every run of the store matching ``filter_string``, all active experiments, page by page."""
    from mlflow.entities import ViewType

    exp_ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    for i in range(0, len(exp_ids), 50):  # search_runs takes a bounded list of experiments
        token = None
        while True:
            page = client.search_runs(exp_ids[i:i + 50], filter_string, max_results=1000, page_token=token)
            yield from page
            token = page.token
            if not token:
                break


def open_runs(client) -> list:
    """Every RUNNING run of the store, all experiments."""
    return list(all_runs(client, "attributes.status = 'RUNNING'"))


MIN_RUN_ID_PREFIX = 6  # as short as people copy ids from a listing, long enough to rarely collide


def find_run_by_prefix(client, prefix: str, uri: str):
    """The one run whose id starts with ``prefix`` (ids are shown shortened, as git's are), or a
    ConfigError: no such run, or several (named). MLflow's filters cannot match an id prefix."""
    from orchard.errors import ConfigError

    if len(prefix) < MIN_RUN_ID_PREFIX:
        raise ConfigError("run id", f"a run of the store {uri} (its id, or at least its first "
                                    f"{MIN_RUN_ID_PREFIX} characters); {prefix!r} is not one")
    found = [r for r in all_runs(client) if r.info.run_id.startswith(prefix)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConfigError("run id", f"a run of the store {uri}; {prefix!r} is not one")
    raise ConfigError("run id", f"one run; {prefix!r} starts {len(found)}: "
                                f"{', '.join(r.info.run_id for r in found[:5])}; give more of the id")


def reap(client) -> list[str]:
    """Close every lost run as FAILED with the reason; returns their ids."""
    closed = []
    for run in open_runs(client):
        reason = why_lost(run.data.tags)
        if reason is None:
            continue
        client.set_tag(run.info.run_id, "orchard.error", reason)
        client.set_terminated(run.info.run_id, status="FAILED")
        closed.append(run.info.run_id)
    return closed


def main(argv: list[str]) -> int:
    """``python -m orchard runs reap|list [tracking.uri=...]``."""
    from mlflow.tracking import MlflowClient

    from orchard.tracking import resolve_uri

    usage = "usage: python -m orchard runs {reap|list} [tracking.uri=sqlite:///mlflow.db]"
    if not argv or argv[0] not in ("reap", "list"):
        print(usage, file=sys.stderr)
        return 2
    uri = "sqlite:///mlflow.db"
    for arg in argv[1:]:
        if not arg.startswith("tracking.uri="):
            print(f"orchard runs: unknown argument {arg!r}; {usage}", file=sys.stderr)
            return 2
        uri = arg.split("=", 1)[1]
    from orchard.errors import ConfigError
    from orchard.tracking import check_store

    try:
        check_store(uri)
    except ConfigError as err:
        print(f"orchard: {err}", file=sys.stderr)
        return 2
    client = MlflowClient(resolve_uri(uri))
    if argv[0] == "reap":
        closed = reap(client)
        print(f"orchard: closed {len(closed)} run(s) whose driver was lost" + (": " + ", ".join(closed) if closed else ""))
        return 0
    for run in open_runs(client):
        tags = run.data.tags
        state = why_lost(tags) or f"alive (pid {tags.get('orchard.pid', '?')} on {tags.get('orchard.host', '?')})"
        print(f"{run.info.run_id}  {tags.get('mlflow.runName', '')}  {state}")
    return 0
