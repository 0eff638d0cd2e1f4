"""Leases: one driver at a time for what must not be driven twice (a run being resumed, a sweep).

Two ``resume <id>`` of one run would train into the same Ray Train folder; the same sweep command
in two terminals would drive one Tune experiment from two processes, each closing the other's
trials. Whoever starts such work first takes a lease: a tag ``orchard.lease`` on the MLflow run
(the run being resumed, the sweep's parent run) naming its driver, refreshed like the run
heartbeat (orchard/tracking/lost_runs.py). A second taker finds the lease alive and stops with one line
naming the holder; a lease whose driver is gone (same machine: its process; elsewhere: a
heartbeat older than ``runs.LOST_AFTER_S``) is taken over, with a line saying so; so is a lease
whose heartbeat lies in the future (``forged``: whoever can write a tag could block every resume).

MLflow has no compare-and-set, so taking is write-then-verify: write our token, wait
``SETTLE_S`` (longer than a tag write takes), read it back; of two takers at the same instant
only the last writer still finds its own token, and the other backs off.

Without a store (a sweep with ``tracking=none``) the lease is an exclusive lock on a file in the
sweep's own folder (``take_local``): the kernel holds it while the driver lives, so it needs no
heartbeat and is never stale, but it guards this machine's folder only. A ``resume`` always has
a store: it reads the run from it.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

from orchard import background
from orchard.terminal.console import say
from orchard.tracking import lost_runs as runs

TAG = "orchard.lease"
SETTLE_S = 1.0


class LeaseHeld(Exception):
    """Someone alive holds the lease; the message names them (host, pid, since)."""

    def __init__(self, what: str, holder: dict):
        self.holder = holder
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
        beat = ""
        if "beat" in holder:  # a local lock (take_local) has none: the kernel keeps it while its process lives
            ago = time.time() - float(holder["beat"])  # this host's clock: a few seconds of skew show here only
            beat = f" (heartbeat {max(ago, 0):.0f} s ago)"
        super().__init__(f"{what} is already driven by pid {holder.get('pid')} on {holder.get('host')} "
                         f"since {since}{beat}; wait for it to end or stop it")


def _record(token: str, what: str, since: float, offset_s: float = 0.0) -> dict:
    me = runs.driver_tags()
    return {"token": token, "what": what, "host": me["orchard.host"], "boot_id": me["orchard.boot_id"],
            "pid_ns": me["orchard.pid_ns"], "pid": me["orchard.pid"], "pid_start": me["orchard.pid_start"],
            "since": f"{since:.0f}", "beat": f"{time.time() + offset_s:.0f}"}  # the beat on the store's clock


def _offset(client) -> float:
    """The store's clock minus this host's (runs.store_clock_offset); 0 if it cannot be asked."""
    try:
        return runs.store_clock_offset(client.tracking_uri)
    except OSError:
        return 0.0


def read(client, run_id: str) -> dict | None:
    """The lease on ``run_id`` as recorded (None: free, or unreadable)."""
    text = client.get_run(run_id).data.tags.get(TAG)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


# A beat is written on the store's clock (``_record``): one later than the store's now by more
# than this is no driver's but a forged lease's, which would hold off every taker for ever.
FUTURE_BEAT_S = 30.0


def forged(holder: dict, now: float | None = None) -> bool:
    """The lease's heartbeat lies in the future (beyond ``FUTURE_BEAT_S``): written by hand, not by a driver."""
    try:
        beat = float(holder.get("beat", 0))
    except (TypeError, ValueError):
        return True
    return beat > (time.time() if now is None else now) + FUTURE_BEAT_S


def alive(holder: dict, now: float | None = None) -> bool:
    """The holder's driver may still be working (the reaper's rule, orchard/tracking/lost_runs.py;
    a ``forged`` lease never is); ``now``: the store's time, the clock beats are written on."""
    if forged(holder, now):
        return False
    tags = {"orchard.host": holder.get("host"), "orchard.boot_id": holder.get("boot_id"),
            "orchard.pid": holder.get("pid"), "orchard.pid_start": holder.get("pid_start"),
            runs.TAG_HEARTBEAT: holder.get("beat", "0"),
            **({"orchard.pid_ns": holder["pid_ns"]} if "pid_ns" in holder else {})}
    return runs.why_lost(tags, now) is None


class Lease:
    """A lease this process holds; refreshed from a daemon thread until ``release()``."""

    def __init__(self, client, run_id: str, what: str, interval_s: float = runs.HEARTBEAT_S):
        self.client, self.run_id, self.what = client, run_id, what
        self.token = uuid.uuid4().hex
        self._since = time.time()
        self._offset = _offset(client)
        self._poller = background.Poller(self._beat, interval_s, "orchard-lease")   # a store hiccup: the next beat retries

    def _write(self) -> None:
        self.client.set_tag(self.run_id, TAG, json.dumps(_record(self.token, self.what, self._since, self._offset)))

    def _beat(self):
        holder = read(self.client, self.run_id)
        if holder is None or holder.get("token") != self.token:
            return background.Poller.DONE  # taken over (we looked dead): never overwrite the new holder
        self._write()

    def release(self) -> None:
        self._poller.stop(timeout_s=0)
        try:
            holder = read(self.client, self.run_id)
            if holder is not None and holder.get("token") == self.token:
                self.client.delete_tag(self.run_id, TAG)
        except Exception:  # the lease then ends by age
            pass


def take(client, run_id: str, what: str, settle_s: float = SETTLE_S) -> Lease:
    """Hold the lease on ``run_id`` for ``what`` (a phrase: "the resume of run 1a2b"); raises
    ``LeaseHeld`` naming the holder while someone alive holds it."""
    holder = read(client, run_id)
    now = time.time() + _offset(client)
    if holder is not None and alive(holder, now):
        raise LeaseHeld(what, holder)
    if holder is not None:
        why = "whose heartbeat is in the future (forged)" if forged(holder, now) else "whose driver is gone"
        say(f"orchard: taking over {what} from pid {holder.get('pid')} on {holder.get('host')}, {why}", file=sys.stderr)
    lease = Lease(client, run_id, what)
    lease._write()
    time.sleep(settle_s)  # a taker racing us has written by now: the last writer wins
    holder = read(client, run_id)
    if holder is None or holder.get("token") != lease.token:
        raise LeaseHeld(what, holder or {"host": socket.gethostname(), "pid": "?"})
    lease._poller.start()
    return lease


class LocalLease:
    """A lease held as an exclusive lock on a file of this machine (``take_local``)."""

    def __init__(self, lock):
        self._lock = lock

    def release(self) -> None:
        # the files stay: unlinking the lock while a second taker has it open would give two locks
        if self._lock is not None:
            self._lock.release()  # closing the file drops the kernel's lock
            self._lock = None


def take_local(folder: Path, what: str) -> LocalLease:
    """The lease of work whose state is a folder of this machine, without a tracking store
    (a sweep with ``tracking=none``): an exclusive lock (``filelock``, the kernel's ``flock``) on
    ``<folder>/.orchard.lease``. The kernel drops it when its process dies, so there is no
    heartbeat and nothing to take over; ``.orchard.lease.json`` beside it names the holder for the
    refusal. It guards one machine: two machines sharing a bucket need the store's lease
    (``take``). Raises ``LeaseHeld`` naming the live holder."""
    from filelock import FileLock, Timeout

    path = Path(folder) / ".orchard.lease"
    holder_file = path.with_name(path.name + ".json")
    lock = FileLock(path, mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            holder = json.loads(holder_file.read_text() or "{}")
        except (OSError, ValueError):  # the holder is writing it this instant
            holder = {}
        raise LeaseHeld(what, holder or {"host": socket.gethostname(), "pid": "?"}) from None
    me = runs.driver_tags()
    record = json.dumps({"what": what, "host": me["orchard.host"], "pid": me["orchard.pid"],
                         "since": f"{time.time():.0f}"})
    tmp = holder_file.with_name(f"{holder_file.name}.tmp-{os.getpid()}")
    tmp.write_text(record)
    os.replace(tmp, holder_file)  # a refused taker never reads half a record
    return LocalLease(lock)
