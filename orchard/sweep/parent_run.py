"""The sweep's parent MLflow run: opened (or re-opened on resume) under the sweep's lease, closed
with the best trial and the leaderboard, or KILLED with the reason."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from orchard.config import redact
from orchard.sweep.leaderboard import best_row, FINAL, STOPPED_EARLY
from orchard.sweep.saved_state import checked_state, restorable
from orchard.terminal import interrupts
from orchard.terminal.console import say


class ParentRun:
    """The sweep's MLflow run (none with ``tracking=none``), kept across resumes by its key."""

    def __init__(self, tracked, heartbeat, lease=None, sealed: dict | None = None):
        self.tracked, self.heartbeat, self.lease = tracked, heartbeat, lease
        self.sealed = sealed  # the saved Tune state's sealed files (sweep_seal); None: nothing to resume
        self.run_id = tracked.run_id if tracked else None
        self.client = tracked.client() if tracked else None

    @classmethod
    def open(cls, cfg: dict, key: str, folder: Path, need, concurrent: int) -> "ParentRun":
        """The parent run, with the sweep's lease (orchard/tracking/leases.py): the same sweep already
        driven by a live process, on this machine or another, raises ``LeaseHeld`` before
        anything is touched. On this machine a file lock makes "read the state, open the
        parent, take the lease" one step for two commands started together. Saved Tune state
        that fails its seal raises ``sweep_seal.Unsealed``, also before anything is touched.
        With ``tracking=none`` there is no store to hold the lease: a lock on the sweep's
        folder holds it (``leases.take_local``: this machine only)."""
        from filelock import FileLock

        from orchard.tracking import leases
        from orchard.tracking import mlflow_run as tracking
        from orchard.tracking import store as tracking_store
        from orchard.tracking.lost_runs import Heartbeat

        what = f"sweep {key}"
        if not cfg["tracking"]["enabled"]:
            lease = leases.take_local(folder, what)
            return cls(None, None, lease, checked_state(restorable, cfg, lease))
        state_file = folder / "orchard_sweep.json"
        uri = tracking_store.resolve_uri(cfg["tracking"]["uri"])
        with FileLock(str(folder / ".orchard_sweep.lock"), timeout=120):
            previous = json.loads(state_file.read_text()).get("parent_run_id") if state_file.exists() else None
            lease = None
            if previous and run_exists(previous, uri):
                lease = leases.take(tracking.TrackedRun(previous, "", uri).client(), previous, what)
            sealed = checked_state(restorable, cfg, lease)  # read after the lease: the state is ours now
            tracked = reopen_run(previous, uri) if lease is not None and sealed is not None else None
            with interrupts.deferred(reraise=True):  # a parent run either exists with its state file, or not at all
                if tracked is None:
                    if lease is not None:  # a parent whose Tune state was never saved: a new one replaces it
                        lease.release()
                    tags = {"orchard.sweep": cfg["sweep"]["name"], "orchard.sweep_key": key,
                            "orchard.sweep_dir": str(folder), "orchard.overrides": json.dumps(redact.overrides(cfg.get("_overrides", []))),
                            "orchard.sweep.trial_resources": need.describe(), "orchard.sweep.concurrent_trials": str(concurrent)}
                    tracked = tracking.open_run(cfg, cfg.get("run_name") or f"sweep-{key}", extra_tags=tags)
                    lease = leases.take(tracked.client(), tracked.run_id, what, settle_s=0)  # new: nobody races for it
                    state_file.write_text(json.dumps({"parent_run_id": tracked.run_id, "key": key}))
                heartbeat = Heartbeat(tracked.client(), tracked.run_id)
        return cls(tracked, heartbeat, lease, sealed)

    def close_children(self, trials: list, scheduler: str, metric: str, interrupted: bool) -> None:
        """Every child run still RUNNING is closed KILLED, with why: cut by the scheduler, or the
        sweep was interrupted (its trial reruns on resume)."""
        if self.client is None:
            return
        stopped = {(t.last_result or {}).get("run_id") for t in trials
                   if t.status == "TERMINATED" and FINAL not in (t.last_result or {})}
        for run in self._children("RUNNING"):
            run_id = run.info.run_id
            if run_id in stopped and not interrupted:
                reason = STOPPED_EARLY.format(scheduler=scheduler.upper(), metric=metric)
            elif interrupted:
                reason = "sweep interrupted; this trial runs again when the sweep resumes"
            else:
                reason = "its trial ended without closing the run"
            try:
                self.client.set_tag(run_id, "orchard.error", reason)
                self.client.set_terminated(run_id, status="KILLED")
            except Exception as exc:  # the reaper closes it later ("driver lost")
                say(f"orchard: could not close trial run {run_id}: {exc}", file=sys.stderr)

    def _children(self, status: str) -> list:
        exp_id = self.client.get_run(self.run_id).info.experiment_id
        return self.client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{self.run_id}' "
                                                 f"and attributes.status = '{status}'", max_results=5000)

    def record(self, rows: list[dict], metric: str, folder: Path) -> None:
        board = folder / "leaderboard.json"
        # strict JSON: a diverged trial's NaN/inf metric is null (it ranks last)
        board.write_text(json.dumps([{**r, "metric": r["metric"] if math.isfinite(r["metric"]) else None}
                                     for r in rows], indent=2))
        if self.client is None:
            return
        best = best_row(rows)
        if best:
            for key, value in best["params"].items():
                self.client.set_tag(self.run_id, f"best.{key}", str(value))
            self.client.log_metric(self.run_id, f"best/{metric}", best["metric"])
            self.client.set_tag(self.run_id, "best_run_id", best["run_id"])
        self.client.log_artifact(self.run_id, str(board))

    def close(self, status: str, reason: str | None = None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.lease is not None:
            self.lease.release()
        if self.client is None:
            return
        if reason:
            self.client.set_tag(self.run_id, "orchard.error", reason[:5000])
        self.client.set_terminated(self.run_id, status=status)


def run_exists(run_id: str, uri: str) -> bool:
    from mlflow.exceptions import MlflowException

    from orchard.tracking import mlflow_run as tracking

    try:
        tracking.TrackedRun(run_id, "", uri).client().get_run(run_id)
        return True
    except MlflowException:
        return False


def reopen_run(run_id: str | None, uri: str):
    """The parent run of a sweep being resumed, RUNNING again and driven by this process (None
    if the store no longer has it).  Its children left RUNNING by a crash are closed KILLED."""
    from mlflow.entities import RunTag
    from mlflow.exceptions import MlflowException

    from orchard.tracking import mlflow_run as tracking
    from orchard.tracking.lost_runs import driver_tags

    if not run_id:
        return None
    tracked = tracking.TrackedRun(run_id, "", uri)
    client = tracked.client()
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    client.update_run(run_id, status="RUNNING")
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in driver_tags().items()])
    if "orchard.error" in run.data.tags:  # e.g. "driver lost" from the reaper, or the interrupt
        client.delete_tag(run_id, "orchard.error")
    stale = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}' "
                                                         "and attributes.status = 'RUNNING'", max_results=5000)
    for child in stale:
        client.set_tag(child.info.run_id, "orchard.error", "sweep interrupted; this trial runs again on resume")
        client.set_terminated(child.info.run_id, status="KILLED")
    return tracking.TrackedRun(run_id, run.info.experiment_id, uri)
