"""Runs whose driver died without a word: a heartbeat while a run lives, a reaper after.

MLflow cannot tell a run that is training from one whose driver was SIGKILLed, ran out of
memory or lost power: both say RUNNING forever (mlflow#3932).  So every orchard run carries
who drives it (host, boot id, PID namespace, pid and the pid's start time) and a heartbeat tag
that the driver refreshes every ``HEARTBEAT_S`` seconds.  A RUNNING run is *lost* when

- its driver was in this process table (same host name, boot id and PID namespace) and that
  process is gone, or
- its heartbeat is older than ``LOST_AFTER_S`` (a driver on another machine or in another
  container, or on this machine before a reboot).

Heartbeats are written and judged on the *store's* clock (``store_clock_offset``): two hosts
whose clocks disagree, or a reaper whose clock jumped, still agree on a heartbeat's age.  A run
closed by mistake (its driver stalled past the bound, then beat again) is reopened by its own
heartbeat, and its driver then writes its true status as usual.

Every orchard start closes lost runs as FAILED with the reason "driver lost"
(``reap``); ``python -m orchard runs reap`` does the same on demand and ``runs list`` shows
what is open.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from orchard import background

HEARTBEAT_S = 10.0
# Twelve beats: a driver is judged lost only after many missed beats in a row (a store hiccup,
# a busy host), never after one late write.
LOST_AFTER_S = 120.0
TAG_HEARTBEAT = "orchard.heartbeat"
TAG_ERROR = "orchard.error"
# The store's clock minus the driver's, in s, as last measured (for whoever debugs a reaped run).
TAG_CLOCK_SKEW = "orchard.clock_skew_s"
# When a heartbeat reopened its run after a reaper closed it by mistake (store's clock, Unix s).
TAG_REOPENED = "orchard.reopened_after_reap"
LOST_REASON = "driver lost: its process ended without closing the run (SIGKILL, out of memory or power loss)"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _pid_namespace() -> str:
    """This process's PID namespace: containers that share the host's boot id each have their
    own, and a pid means nothing outside its namespace."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "unknown"


def _process_start(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def driver_tags() -> dict[str, str]:
    """Who drives a run: set when the run is created, so even a run cut off at once is reapable.
    The heartbeat here is on this host's clock; ``Heartbeat``'s first beat, at once, rewrites it
    on the store's."""
    pid = os.getpid()
    return {"orchard.host": socket.gethostname(), "orchard.boot_id": _boot_id(), "orchard.pid_ns": _pid_namespace(),
            "orchard.pid": str(pid), "orchard.pid_start": f"{_process_start(pid) or 0:.3f}",
            TAG_HEARTBEAT: f"{time.time():.0f}"}


def store_clock_offset(uri: str, timeout_s: float = 10.0) -> float:
    """Seconds to add to this host's ``time.time()`` to read the tracking store's clock.

    An MLflow server (http/https): from the ``Date`` header of one ``GET /health`` (any answer
    carries it, a 401 behind a login too), whole seconds, ample against ``LOST_AFTER_S``.  A
    sqlite or file store lives on this host's disk, is written on this host's clock, and a reaper
    of it runs here: 0.  Raises ``OSError`` when the server cannot be asked."""
    if not uri.startswith(("http://", "https://")):
        return 0.0
    import urllib.error
    import urllib.request
    from email.utils import parsedate_to_datetime

    sent = time.time()
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
            date = reply.headers.get("Date")
    except urllib.error.HTTPError as err:
        date = err.headers.get("Date")
    received = time.time()
    try:
        server = parsedate_to_datetime(date).timestamp() + 0.5  # the header truncates to the second: its middle
    except (TypeError, ValueError):
        raise OSError(f"{uri} sent no usable Date header ({date!r})") from None
    return server - (sent + received) / 2


def store_now(uri: str) -> float:
    """The tracking store's time (Unix s)."""
    return time.time() + store_clock_offset(uri)


class Heartbeat:
    """Refreshes the run's heartbeat tag, on the store's clock, from a daemon thread until
    ``stop()``; reopens the run if a reaper closed it while this driver lived."""

    def __init__(self, client, run_id: str, interval_s: float = HEARTBEAT_S):
        self.client, self.run_id, self.interval = client, run_id, interval_s
        self._offset = 0.0  # the store's clock minus ours, as last measured
        self._reopening = threading.Lock()  # stop()'s last check and a beat's never interleave
        # the first beat at once: the tag written at the run's creation is on this host's clock
        self._poller = background.Poller(self._beat, interval_s, "orchard-heartbeat", at_once=True)
        self._poller.start()

    def _beat(self) -> None:
        from mlflow.entities import RunTag

        from orchard.tracking.store import retried

        try:  # measured at every beat: a clock stepped (NTP) mid-run must not age our beats
            self._offset = store_clock_offset(self.client.tracking_uri)
        except Exception:  # the server did not answer: the last offset serves until it does
            pass
        try:
            now = time.time() + self._offset
            retried(self.client.log_batch, self.run_id, tags=[
                RunTag(TAG_HEARTBEAT, f"{now:.0f}"), RunTag(TAG_CLOCK_SKEW, f"{self._offset:.0f}")])
            self._reopen_if_reaped(now, by_beat=True)
        except Exception:  # a store hiccup must not end the run; the next beat retries
            pass

    def _reopen_if_reaped(self, now: float, by_beat: bool) -> None:
        """A reaper closed this run FAILED "driver lost" (a stall longer than the bound, a clock
        or namespace it misjudged), yet its driver is here: make it RUNNING again.  Runs closed
        for any other reason (by the sweep, by the user) are left as they are."""
        from orchard.tracking.store import retried

        with self._reopening:
            if by_beat and self._poller.stopping.is_set():
                return  # stop() made the last check; the run is being closed with its true status
            run = retried(self.client.get_run, self.run_id)
            if not run.data.tags.get(TAG_ERROR, "").startswith(LOST_REASON):
                return
            if by_beat and run.info.status == "RUNNING":
                return  # a reaper between its two writes (reason, then status): the next beat sees both
            if run.info.status != "RUNNING":
                retried(self.client.update_run, self.run_id, status="RUNNING")
            retried(self.client.delete_tag, self.run_id, TAG_ERROR)
            retried(self.client.set_tag, self.run_id, TAG_REOPENED, f"{now:.0f}")

    def stop(self) -> None:
        """No reopening after this returns.  Called before the driver closes the run: a run reaped
        since the last beat is reopened here, so the close that follows records its true status
        and no stale "driver lost"."""
        self._poller.stop(timeout_s=0)
        try:
            self._reopen_if_reaped(time.time() + self._offset, by_beat=False)
        except Exception:  # the store is unreachable: the driver's close meets the same
            pass


def why_lost(tags: dict, now: float | None = None) -> str | None:
    """The reason a RUNNING run's driver is gone, or None while it may be alive.  ``now``: the
    store's time (``store_now``), the clock heartbeats are written on; by default this host's,
    right for a store on this host's disk."""
    now = time.time() if now is None else now
    if TAG_HEARTBEAT not in tags:
        return None  # not an orchard run (or from before heartbeats): leave it alone
    # Same process table (host name, boot id and PID namespace): it is the truth.  Anything else
    # (another machine, another container, this machine rebooted: a power loss) is judged by the
    # heartbeat's age.  A run from before the namespace tag is judged as it was then.
    same_pids = (tags.get("orchard.host") == socket.gethostname() and tags.get("orchard.boot_id") == _boot_id()
                 and tags.get("orchard.pid_ns", _pid_namespace()) == _pid_namespace())
    if same_pids:
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
    from orchard.tracking.store import retried

    now = store_now(client.tracking_uri)
    closed = []
    for run in open_runs(client):
        if why_lost(run.data.tags, now) is None:
            continue
        # Judged again on a fresh read: the run may have closed itself, or beaten, since the search.
        run = retried(client.get_run, run.info.run_id)
        reason = why_lost(run.data.tags, now) if run.info.status == "RUNNING" else None
        if reason is None:
            continue
        close_lost(client, run.info.run_id, reason)
        closed.append(run.info.run_id)
    return closed


def close_lost(client, run_id: str, reason: str) -> None:
    """Close a run ``why_lost`` judged lost: FAILED, with the reason (``reap``; ``resume`` of one run)."""
    from orchard.tracking.store import retried

    retried(client.set_tag, run_id, TAG_ERROR, reason)
    retried(client.set_terminated, run_id, status="FAILED")
