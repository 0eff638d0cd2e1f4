"""One trial: a run of the lifecycle's ``run_one`` inside Tune, its metric fed to Tune from the run's
sink, its retry finding its own run, ASHA's early stop closing it KILLED with the reason."""
from __future__ import annotations

import copy
import math
import sys
import threading
import uuid
from pathlib import Path
from typing import Callable, TYPE_CHECKING

from orchard import background
from orchard.config import registry
from orchard.errors import ConfigError
from orchard.sweep import gpu_fit
from orchard.sweep.leaderboard import FINAL, rank_key, STOPPED_EARLY, trial_error
from orchard.terminal import console, interrupts
from orchard.terminal.console import say

if TYPE_CHECKING:
    from orchard.sweep.parent_run import ParentRun
from orchard.sweep.space import trial_config


# --------------------------------------------------------------------------- [3] trials
class MetricFeed:
    """Reports every new value of the sweep metric to Tune, from a thread of the trial.

    The metric may be logged anywhere in the run (the driver, a task, an actor, a Ray Train
    worker): all of it goes through the run's metrics sink, which keeps the watched key's
    values for ``logged_since``.  Reports are serialized with the trial's final report.  Each
    report also carries the last GPU memory the run's workers logged (``gpu_fit.KEYS``), for a
    sweep whose trials share a GPU."""

    def __init__(self, metric: str, interval_s: float = 0.5):
        self.metric, self.interval = metric, interval_s
        self.seen, self.last, self.run_id, self.sink = 0, None, "", None
        self.gpu: dict[str, float] = {}
        self._gpu_seen = dict.fromkeys(gpu_fit.KEYS, 0)
        self.lock = threading.Lock()
        self._poller = background.Poller(self._poll_or_say, interval_s, "orchard-sweep-metric")

    @property
    def keys(self) -> tuple[str, ...]:
        """What the run's sink keeps for this feed from its start (``MetricsSink(watch=...)``)."""
        return (self.metric, *gpu_fit.KEYS)

    def start(self, ctx) -> None:
        """Poll the run's sink from now on. It watches ``keys`` from its start, so the workload
        begins without waiting for the sink's process (its first poll does)."""
        self.sink, self.run_id = ctx._sink, ctx.run_id or ""
        self._poller.start()

    def _poll_or_say(self) -> None:
        try:
            self.poll()
        except Exception as exc:  # a sink restart or a slow store: the next poll tries again
            say(f"orchard: sweep metric {self.metric}: {type(exc).__name__}: {exc}", file=sys.stderr)

    def poll(self) -> None:
        import ray
        from ray import tune

        if self.sink is None:
            return
        with self.lock:
            new = ray.get(self.sink.logged_since_each.remote({**self._gpu_seen, self.metric: self.seen}), timeout=60)
            for key in self._gpu_seen:  # before the metric: its report carries them
                for _, value in new[key]:
                    self._gpu_seen[key] += 1
                    # several workers: the biggest peak, the least found beside it
                    pick = {gpu_fit.TORCH_PEAK: max, gpu_fit.OTHER: min}.get(key, lambda _, latest: latest)
                    self.gpu[key] = pick(self.gpu.get(key, value), value)
            for step, value in new[self.metric]:
                self.seen += 1
                self.last = value
                tune.report({self.metric: value, "orchard/step": step, "run_id": self.run_id, **self.gpu})

    def stop(self) -> None:
        """Stop polling, after one last poll for what was logged since the previous one."""
        if self._poller.stopping.is_set():
            return
        self._poller.stop(timeout_s=60)
        self._poll_or_say()


class _Watched:
    """The workload as ``run_one`` sees it, with the metric feed started inside its run."""

    def __init__(self, module, feed: MetricFeed):
        self._module, self._feed = module, feed

    def __getattr__(self, name):
        return getattr(self._module, name)

    def run(self, cfg: dict, ctx):
        self._feed.start(ctx)
        try:
            return registry.entry(self._module, cfg["mode"])(cfg, ctx)
        finally:  # report the last values while the run's sink still lives (run_one then ends it)
            try:
                ctx.flush()
            except Exception:
                pass
            self._feed.stop()


def make_trainable(base: dict, module_name: str, parent_run_id: str | None, metric: str, run_one: Callable):
    session = uuid.uuid4().hex  # this invocation of the sweep: a retry looks for its trial's run of it
    uri = base["tracking"]["uri"] if base["tracking"]["enabled"] else None

    def trainable(values: dict) -> None:
        import importlib

        from ray import tune

        cfg = trial_config(base, values)
        context = tune.get_context()
        trial = context.get_trial_name()
        cfg["run_name"] = f"{base['sweep']['name']}-{trial}"
        cfg["sweep"] = None
        module = importlib.import_module(module_name)
        feed = MetricFeed(metric)
        cfg["_trial"] = {"id": context.get_trial_id(), "session": session, "watch": list(feed.keys),
                         **retry_of(uri, parent_run_id, context.get_trial_id(), session, trial, cfg, module)}
        _trial_log(base)
        try:
            outcome = run_one(cfg, _Watched(module, feed), parent_run_id=parent_run_id, quiet=True)
        finally:
            feed.stop()
            console.release()
        if outcome.exit_code != 0:
            raise RuntimeError(f"trial {trial} failed: {outcome.error}")
        final = {k: v for k, v in outcome.metrics.items() if isinstance(v, (int, float))}
        if metric not in final:
            if feed.last is None:
                raise RuntimeError(f"trial {trial}: the run never logged the sweep metric {metric}")
            final[metric] = feed.last  # a per-epoch metric: its last value ranks the trial
        with feed.lock:
            tune.report({**final, **feed.gpu, "run_id": outcome.run_id or "", FINAL: 1.0})

    return trainable


def _trial_log(base: dict) -> None:
    """A trial's process logs as a single run's does (orchard/terminal/console.py): its descriptors to a
    log under ``<output_dir>/logs``, so the trial's run folder and MLflow run get its part as
    ``orchard.log`` (Ray's, Train's and torch's lines with orchard's). ``verbose`` leaves them
    in Ray's own worker log."""
    if base.get("verbose"):
        return
    logs = base.get("logs") or {}
    console.quiet(Path(base["output_dir"]) / "logs", max_bytes=int(logs.get("max_mb", 64) * 2**20),
                  backups=logs.get("backups"))


def retry_of(uri: str | None, parent_run_id: str | None, trial_id: str, session: str, trial: str,
             cfg: dict, module) -> dict:
    """What this attempt of a trial continues (Tune retries a trial whose actor died,
    ``sweep.max_failures`` times): nothing for a first attempt; for a retry of an attempt lost
    with its process (its node, its worker: the run was left RUNNING, or reaped as "driver
    lost"), its MLflow run and checkpoints (the workload's ``resume`` pointed at its own folder).
    An attempt that ended by itself (the run FAILED with its error) is not trained again: its
    error is raised at once. Runs of an earlier invocation (an interrupted sweep resumed) are
    not continued: the trial starts afresh, as before retries existed."""
    if uri is None or parent_run_id is None:
        return {}  # untracked: no run to find; a retried trial starts over in a new folder
    from orchard.tracking.lost_runs import LOST_REASON, TAG_ERROR
    from orchard.tracking.store import resolve_uri, retried
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolve_uri(uri))
    found = retried(client.search_runs, [client.get_run(parent_run_id).info.experiment_id],
                    f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`orchard.trial_id` = '{trial_id}' "
                    f"and tags.`orchard.sweep_session` = '{session}'")
    if not found:
        return {}
    run = found[0]
    error = run.data.tags.get(TAG_ERROR, "")
    if run.info.status not in ("RUNNING", "FAILED") or (run.info.status == "FAILED" and not error.startswith(LOST_REASON)):
        raise RuntimeError(f"trial {trial} failed: {error or run.info.status} (not retried: the run ended by itself)")
    attempt = int(run.data.tags.get("orchard.trial_attempt", "1")) + 1
    folder = run.data.tags.get("orchard.run_dir")
    say(f"orchard: trial {trial}: attempt {attempt - 1} was lost with its process; attempt {attempt} continues "
        f"run {run.info.run_id} from its last checkpoint", file=sys.stderr)
    resume = getattr(module, "resume", None)
    if folder and resume is not None:
        fresh = copy.deepcopy(cfg)
        try:
            resume(cfg, folder)  # the workload points its config at the lost attempt's checkpoint
        except ConfigError as why:  # lost before its first checkpoint: the same folder, from the start
            cfg.clear()
            cfg.update(fresh)  # as it was: a hook may have set its key before it found no checkpoint
            say(f"orchard: trial {trial}: no checkpoint to continue ({why}); it starts over", file=sys.stderr)
    return {"reopen": run.info.run_id, "attempt": attempt}


def trial_stopper(parent: "ParentRun", scheduler: str, metric: str, signals_before: int):
    """A Tune callback: a trial the scheduler stops is stopped whole, at once.

    Tune kills a stopped trial's actor, and with it the Ray Train controller it started; Ray
    keeps that controller's worker-group placement group while the sweep's job lives, so the next
    trial's workers waited for its CPUs (forever, before ``cluster.worker_start_timeout_s``), and
    the trial's MLflow run stayed RUNNING beside the next trial's. Here such groups are freed
    (``on_step_begin``) and the stopped trial's run is closed KILLED with the scheduler's reason
    (``on_trial_complete``); the trial's own close then leaves that status (``STOPPED_TAG``)."""
    from ray import tune

    # Tune saves its callbacks with the experiment (a resumed sweep gets them back): plain values only
    uri = parent.tracked.tracking_uri if parent.tracked else None
    reason = STOPPED_EARLY.format(scheduler=scheduler.upper(), metric=metric)

    class StopWhole(tune.Callback):
        def on_step_begin(self, iteration, trials, **info):
            # Tune kills a stopped trial's actor, and its Ray Train controller with it, just
            # after on_trial_complete: their worker group's reservation is freed here, before
            # the next trial's workers ask for those CPUs (launch.free_orphaned_placement_groups)
            import time

            from orchard.strategies.launch import free_orphaned_placement_groups

            if time.monotonic() - getattr(self, "_swept", 0.0) >= 1.0:
                self._swept = time.monotonic()
                free_orphaned_placement_groups()

        def on_trial_complete(self, iteration, trials, trial, **info):
            result = trial.last_result or {}
            run_id = result.get("run_id")
            if FINAL in result or not run_id or uri is None or interrupts.received[signals_before:]:
                return  # it finished; or an interrupted sweep closes its trials itself (close_children)
            from mlflow.tracking import MlflowClient

            client = MlflowClient(uri)
            try:
                client.set_tag(run_id, STOPPED_TAG, "1")
                client.set_tag(run_id, "orchard.error", reason)
                client.set_terminated(run_id, status="KILLED")
            except Exception as exc:  # close_children tries again at the end
                say(f"orchard: could not close stopped trial run {run_id}: {exc}", file=sys.stderr)
            keep_stopped_trials_log(client, run_id)

    return StopWhole()


def keep_stopped_trials_log(client, run_id: str) -> None:
    """The trial's part of its log into its run folder and its MLflow run (``orchard.log``), as
    its own close would have put it: Tune kills a trial its scheduler stops before that close.
    Only where the trial ran on this node (its log and folder are here); said in one line if not kept."""
    from orchard.tracking.mlflow_run import TRIAL_LOG_TAG

    try:
        tags = client.get_run(run_id).data.tags
        where, folder = tags.get(TRIAL_LOG_TAG), tags.get("orchard.run_dir")
        if not where or not folder:
            return
        start, log = where.split(":", 1)
        if not Path(log).is_file() or not Path(folder).is_dir():
            return  # another node's files
        kept = console.copy_other_log(Path(log), int(start), Path(folder) / "orchard.log")
        client.log_artifact(run_id, str(kept))
    except Exception as exc:
        say(f"orchard: the stopped trial's log was not kept in run {run_id}: {str(exc).splitlines()[0][:200]}",
            file=sys.stderr)


STOPPED_TAG = "orchard.stopped_by_scheduler"


def trial_progress(total: int, metric: str, mode: str):
    """A Tune callback: one console line each time a trial starts, ends or fails, with the
    sweep's counts and the best value of ``metric`` so far (a sweep runs for many minutes; its
    trials' own lines go to the log). Plain values only: Tune saves callbacks with the sweep."""
    from ray import tune

    class SweepProgress(tune.Callback):
        best = None
        stopped = 0  # trials the scheduler cut (ASHA): done, without a final result

        def on_trial_result(self, iteration, trials, trial, result, **info):
            value = result.get(metric)
            if isinstance(value, (int, float)) and math.isfinite(value) and (
                    self.best is None or rank_key(value, mode) < rank_key(self.best, mode)):
                self.best = float(value)

        def _say(self, trials, trial, now: str, what: str) -> None:
            # Tune calls back before it sets the trial's new status: counted here as it will be
            counts = {"TERMINATED": 0, "RUNNING": 0, "ERROR": 0}
            for t in trials:
                status = now if t is trial else t.status
                counts[status] = counts.get(status, 0) + 1
            best = f"; best {metric} {self.best:.4g}" if self.best is not None else ""
            cut = f" ({self.stopped} stopped early)" if self.stopped else ""
            say(f"orchard: sweep: {what}; {counts['TERMINATED']}/{total} done{cut}, {counts['RUNNING']} running, "
                f"{counts['ERROR']} failed{best}", flush=True)

        def on_trial_start(self, iteration, trials, trial, **info):
            self._say(trials, trial, "RUNNING", f"trial {trial.trial_id} started")

        def on_trial_complete(self, iteration, trials, trial, **info):
            if FINAL in (trial.last_result or {}):
                self._say(trials, trial, "TERMINATED", f"trial {trial.trial_id} finished")
                return
            self.stopped += 1
            self._say(trials, trial, "TERMINATED", f"trial {trial.trial_id} stopped early by the scheduler")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._say(trials, trial, "ERROR", f"trial {trial.trial_id} failed: {trial_error(trial)}")

    return SweepProgress()


def scheduler_of(s: dict, limit: int, gpu_share: float = 0.0, gpus: float = 0.0):
    """Tune's scheduler for the sweep (FIFO, or ASHA with ``sweep.asha``) that also holds the
    sweep to ``limit`` trials at once, whatever Tune restored; trials that share a GPU
    (``0 < gpu_share < 1`` of the cluster's ``gpus``, ``sweep.fit_gpu_memory``) to as many as its
    memory holds, one until a trial reported its peak (orchard/sweep/gpu_fit.py).

    Tune's own limit (``max_concurrent_trials``) is its searcher's: it suggests no new trial while
    ``limit`` of its suggestions live. A resumed sweep's trials are not suggestions: Tune restores
    every unfinished and errored one PENDING and starts each whose placement group fits (Ray 2.60,
    ``TuneController._maybe_add_actors``), so after a resume two trials ran at once, each waiting
    for CPUs the other held, all failing. Here a trial added beyond ``limit`` live (PENDING or
    RUNNING) ones waits PAUSED, which Tune starts only when the scheduler chooses it: once one of
    the live ones ended. Plain values only: Tune saves the scheduler with the sweep."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if s["scheduler"] != "asha":
        base, kwargs = FIFOScheduler, {}
    else:
        a = s.get("asha") or {}
        # time = the trial's reports of the metric (one per epoch for an epoch metric)
        base, kwargs = ASHAScheduler, dict(time_attr="training_iteration", max_t=int(a.get("max_t", 1000)),
                                           grace_period=int(a.get("grace_period", 1)),
                                           reduction_factor=float(a.get("reduction_factor", 2)))

    def live(controller, but=None) -> int:
        return sum(1 for t in controller.get_trials() if t is not but and t.status in (Trial.PENDING, Trial.RUNNING))

    fit_memory = bool(s.get("fit_gpu_memory", True)) and 0 < gpu_share < 1

    class AtMost(base):
        def __init__(self):
            super().__init__(**kwargs)
            self.shares_limit, self.added = int(limit), set()
            self.fit = gpu_fit.GpuFit(gpu_share, limit, gpus) if fit_memory else None

        @property
        def limit(self) -> int:
            return self.fit.limit if self.fit is not None else self.shares_limit

        def on_trial_add(self, tune_controller, trial):
            super().on_trial_add(tune_controller, trial)
            first = trial.trial_id not in self.added  # Tune adds a trial again when it retries it
            self.added.add(trial.trial_id)
            # Tune calls this before it files the trial by its status: PAUSED, it is not started
            if first and trial.status == Trial.PENDING and live(tune_controller, but=trial) >= self.limit:
                trial.set_status(Trial.PAUSED)

        def choose_trial_to_run(self, tune_controller):
            chosen = super().choose_trial_to_run(tune_controller)
            if chosen is not None and chosen.status == Trial.PAUSED and live(tune_controller) >= self.limit:
                return None
            return chosen

        def on_trial_result(self, tune_controller, trial, result):
            decision = super().on_trial_result(tune_controller, trial, result)
            if self.fit is not None:
                _say_line(self.fit.seen(result))
            return decision

        def on_trial_complete(self, tune_controller, trial, result):
            super().on_trial_complete(tune_controller, trial, result)
            if self.fit is not None:
                _say_line(self.fit.seen(result or {}) or self.fit.ended_unmeasured())

    return AtMost()


def _say_line(line: str | None) -> None:
    if line:
        say(line, flush=True)
