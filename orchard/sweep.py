"""Ray Tune sweeps: ``python -m orchard workload=<name> sweep=<name>`` (docs/sweeps.md).

``conf/sweep/<name>.yaml`` declares the search (param space over any config keys, metric, mode,
samples, scheduler).  The sweep is a parent MLflow run; every trial is a child run
(``mlflow.parentRunId``) made by the lifecycle's ``run_one``, exactly like a single run.

    [1] identity    the sweep's key: workload, sweep name and a digest of the command's
                    overrides (``sweep_key``); its state lives in <output_dir>/sweeps/<key>
    [2] resources   the workload says what one run holds (``resources(cfg)``,
                    orchard/cluster/placement.py): a placement group per trial, and as many trials at
                    once as the cluster holds
    [3] trials      each trial runs ``run_one``; a thread polls the run's metrics sink for the
                    sweep metric, wherever it was logged (driver, task, actor, Train worker),
                    and reports every new value to Tune, so ASHA can cut a lagging trial
    [4] ending      trials stopped early and trials cut off by Ctrl-C/SIGTERM are closed KILLED
                    with the reason; the parent gets the best trial and the leaderboard, or
                    KILLED (exit 130/143: the same command resumes, keeping finished trials)
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Callable

from orchard import config as config_lib
from orchard import console, interrupts, redact, registry, sweep_seal
from orchard.console import say
from orchard.errors import ConfigError
from orchard.outcome import Outcome

PARAM_TYPES = ("grid", "choice", "uniform", "loguniform", "randint")
# Overrides that say where a sweep runs and records, not what its trials compute: they do not
# change its identity, so e.g. the same sweep against another tracking server still resumes.
NOT_IDENTITY = ("tracking", "output_dir", "storage", "cluster", "progress", "run_name", "sweep.max_concurrent_trials", "hydra")
FINAL = "orchard/final"  # set only in a trial's last report: a trial without it was stopped early
STOPPED_EARLY = "stopped early by the {scheduler} scheduler (its {metric} lagged)"


def validate_sweep(cfg: dict) -> None:
    from orchard import schema

    s = cfg["sweep"]
    if "resources_per_trial" in s:
        raise ConfigError("sweep.resources_per_trial", "not a sweep key any more: a trial's resources come from the "
                          "workload's resources(cfg) (docs/sweeps.md); remove it")
    schema.check(schema.Sweep, s, "sweep")  # types and ranges (orchard/schema.py)
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
    search = {k: v for k, v in cfg["sweep"].items() if k != "max_concurrent_trials"}
    identity = {"overrides": identity_overrides(cfg.get("_overrides") or []), "search": search}
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{cfg['workload']['name']}-{cfg['sweep']['name']}-{digest}"


def sweep_dir(cfg: dict) -> Path:
    return Path(cfg["output_dir"]).resolve() / "sweeps" / sweep_key(cfg)


def tune_path(cfg: dict) -> str:
    """Tune's experiment folder: ``<storage root>/sweeps/<key>/tune`` (a URI with ``storage.uri``)."""
    from orchard.storage import Storage

    return Storage.root(cfg).child("sweeps", sweep_key(cfg), "tune").uri


# --------------------------------------------------------------------------- [2] resources
def trial_resources(cfg: dict, module):
    """What one trial holds: the workload's ``resources(cfg)``; a workload that does not say is
    taken to run its tasks in one CPU of the trial's own reservation."""
    from orchard.cluster.placement import Resources, bundles

    fn = getattr(module, "resources", None)
    return fn(cfg) if fn is not None else Resources(in_trial=bundles(1, 1.0))


# --------------------------------------------------------------------------- [3] trials
class MetricFeed:
    """Reports every new value of the sweep metric to Tune, from a thread of the trial.

    The metric may be logged anywhere in the run (the driver, a task, an actor, a Ray Train
    worker): all of it goes through the run's metrics sink, which keeps the watched key's
    values for ``logged_since``.  Reports are serialized with the trial's final report."""

    def __init__(self, metric: str, interval_s: float = 0.5):
        self.metric, self.interval = metric, interval_s
        self.seen, self.last, self.run_id, self.sink = 0, None, "", None
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, ctx) -> None:
        import ray

        self.sink, self.run_id = ctx._sink, ctx.run_id or ""
        ray.get(self.sink.watch.remote(self.metric), timeout=60)
        self._thread = threading.Thread(target=self._loop, name="orchard-sweep-metric", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
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
            for step, value in ray.get(self.sink.logged_since.remote(self.metric, self.seen), timeout=60):
                self.seen += 1
                self.last = value
                tune.report({self.metric: value, "orchard/step": step, "run_id": self.run_id})

    def stop(self) -> None:
        """Stop polling, after one last poll for what was logged since the previous one."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        try:
            self.poll()
        except Exception as exc:
            say(f"orchard: sweep metric {self.metric}: {type(exc).__name__}: {exc}", file=sys.stderr)


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


def _make_trainable(base: dict, module_name: str, parent_run_id: str | None, metric: str, run_one: Callable):
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
        cfg["_trial"] = {"id": context.get_trial_id(), "session": session,
                         **_retry_of(uri, parent_run_id, context.get_trial_id(), session, trial, cfg, module)}
        feed = MetricFeed(metric)
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
            tune.report({**final, "run_id": outcome.run_id or "", FINAL: 1.0})

    return trainable


def _trial_log(base: dict) -> None:
    """A trial's process logs as a single run's does (orchard/console.py): its descriptors to a
    log under ``<output_dir>/logs``, so the trial's run folder and MLflow run get its part as
    ``orchard.log`` (Ray's, Train's and torch's lines with orchard's). ``verbose`` leaves them
    in Ray's own worker log."""
    if base.get("verbose"):
        return
    logs = base.get("logs") or {}
    console.quiet(Path(base["output_dir"]) / "logs", max_bytes=int(logs.get("max_mb", 64) * 2**20),
                  backups=logs.get("backups"))


def _retry_of(uri: str | None, parent_run_id: str | None, trial_id: str, session: str, trial: str,
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


def _trial_stopper(parent: "_Parent", scheduler: str, metric: str, signals_before: int):
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

    return StopWhole()


STOPPED_TAG = "orchard.stopped_by_scheduler"


def _progress(total: int, metric: str, mode: str):
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
            self._say(trials, trial, "ERROR", f"trial {trial.trial_id} failed: {_trial_error(trial)}")

    return SweepProgress()


def _scheduler(s: dict):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if s["scheduler"] != "asha":
        return FIFOScheduler()
    a = s.get("asha") or {}
    # time = the trial's reports of the metric (one per epoch for an epoch metric)
    return ASHAScheduler(time_attr="training_iteration", max_t=int(a.get("max_t", 1000)),
                         grace_period=int(a.get("grace_period", 1)), reduction_factor=float(a.get("reduction_factor", 2)))


# --------------------------------------------------------------------------- the sweep
def run_sweep(cfg: dict, module, run_one: Callable) -> Outcome:
    """The Tune search; ``run_one`` is the lifecycle's single run, called once per trial."""
    import ray
    from ray import tune

    s = cfg["sweep"]
    key, folder = sweep_key(cfg), sweep_dir(cfg)
    # [2] what a trial holds, and how many fit at once: checked before anything is recorded
    try:
        need = trial_resources(cfg, module)
        concurrent = need.max_concurrent(ray.cluster_resources(), s.get("max_concurrent_trials"))
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        return Outcome(2, None, {}, str(err))
    folder.mkdir(parents=True, exist_ok=True)
    exp_path = tune_path(cfg)  # Tune's experiment state: in the run storage (s3://... on a cluster)
    from orchard.leases import LeaseHeld

    try:
        parent = _Parent.open(cfg, key, folder, need, concurrent)
    except LeaseHeld as held:  # the same sweep, live elsewhere: touch nothing of it
        say(f"orchard: {held}", file=sys.stderr)
        return Outcome(2, None, {}, str(held))
    except sweep_seal.Unsealed as why:  # never unpickle what this user's driver did not write
        line = (f"sweep {key}: Tune's saved state in {exp_path} {why}; orchard does not unpickle state it did "
                f"not seal (docs/sweeps.md): delete that folder to start this sweep afresh")
        say(f"orchard: {line}", file=sys.stderr)
        return Outcome(2, None, {}, line)
    sealed = parent.sealed  # checked under the lease: None for a new sweep
    resuming = sealed is not None
    metric, mode = s["metric"], s["mode"]
    trainable = tune.with_resources(_make_trainable(anchored(cfg), module.__name__, parent.run_id, metric, run_one),
                                    need.factory())
    say(f"orchard: sweep {key} {'resuming' if resuming else 'starting'} in {folder}\n"
          f"orchard: up to {concurrent} trial(s) at once; each holds {need.describe()}\n"
          f"orchard: stopped or interrupted, the same command resumes it", flush=True)
    signals_before = len(interrupts.received)
    stopper = _trial_stopper(parent, s["scheduler"], metric, signals_before)
    if resuming:
        tuner = tune.Tuner.restore(str(exp_path), trainable=trainable, resume_unfinished=True,
                                   resume_errored=True, restart_errored=False)
    else:
        tuner = tune.Tuner(
            trainable, param_space=param_space(s["params"]),
            tune_config=tune.TuneConfig(metric=metric, mode=mode, num_samples=s["num_samples"],
                                        max_concurrent_trials=concurrent, scheduler=_scheduler(s)),
            run_config=tune.RunConfig(name="tune", storage_path=exp_path.rsplit("/", 1)[0], verbose=0,
                                      callbacks=[stopper, _progress(trial_count(s), metric, mode)],
                                      # a trial whose actor dies (its node lost) is run again (_retry_of)
                                      failure_config=tune.FailureConfig(max_failures=s.get("max_failures", 2))),
        )
        sealed = {"tuner.pkl": sweep_seal.digest(_state(cfg).read_bytes("tuner.pkl"))}  # written just now, by us
    grid, second_signal = None, None
    try:
        grid = tuner.fit()  # Tune's own SIGINT handler stops it gracefully; it then returns
    except KeyboardInterrupt as exc:  # a second Ctrl-C, once Tune gave SIGINT back
        second_signal = exc
    trials = list(grid._experiment_analysis.trials) if grid is not None else []
    staging = _staging(trials)
    _seal(cfg, sealed, staging)
    # Once stopped, Tune marks the trials it cut TERMINATED in memory; the state it saved just
    # before says RUNNING (or PENDING) for them.
    unfinished = [tid for tid, status in _saved_statuses(staging).items() if status not in ("TERMINATED", "ERROR")]
    signals = interrupts.received[signals_before:]
    interrupted = second_signal is not None or bool(signals) or bool(unfinished)
    # [4] close what the trials left open, then the parent
    with interrupts.deferred():
        parent.close_children(trials, s["scheduler"], metric, interrupted)
        if interrupted:
            signum = getattr(second_signal, "signum", None) or (signals[-1] if signals else signal.SIGINT)
            name = signal.Signals(signum).name
            parent.close("KILLED", f"sweep interrupted by {name}; run the same command to resume")
            say(f"orchard: sweep {key} interrupted ({name}); parent run {parent.run_id or '-'} and its running "
                  f"trials marked KILLED; run the same command again to resume", file=sys.stderr)
            return Outcome(128 + int(signum), parent.run_id, {}, f"interrupted by {name}")
        rows = leaderboard(trials, list(s["params"]), metric, mode)
        best = best_row(rows)   # None when no trial's metric is finite (every one diverged)
        parent.record(rows, metric, folder)
        if best and s.get("register") and parent.client is not None:   # sweep.register=<name> (docs/models.md)
            from orchard.models import register_best
            from orchard.tracking.store import resolve_uri
            register_best(resolve_uri(cfg["tracking"]["uri"]), s["register"], best, metric, parent.run_id)
        failed = [t for t in trials if t.status == "ERROR"]
        if best or not (failed or rows):
            parent.close("FINISHED")
        elif rows:
            parent.close("FAILED", no_best_line(rows, metric))
        else:
            parent.close("FAILED", f"every trial failed; first: {_trial_error(failed[0])}")
    say(format_leaderboard(rows, metric, parent.run_id))
    for line in failure_lines(failed):
        say(f"orchard: {line}", file=sys.stderr)
    if not rows:
        return Outcome(1, parent.run_id, {}, "no trial finished")
    if best is None:
        say(f"orchard: {no_best_line(rows, metric)}", file=sys.stderr)
        return Outcome(1, parent.run_id, {}, no_best_line(rows, metric))
    return Outcome(0, parent.run_id, {f"best/{metric}": best["metric"]}, None)


class _Parent:
    """The sweep's MLflow run (none with ``tracking=none``), kept across resumes by its key."""

    def __init__(self, tracked, heartbeat, lease=None, sealed: dict | None = None):
        self.tracked, self.heartbeat, self.lease = tracked, heartbeat, lease
        self.sealed = sealed  # the saved Tune state's sealed files (sweep_seal); None: nothing to resume
        self.run_id = tracked.run_id if tracked else None
        self.client = tracked.client() if tracked else None

    @classmethod
    def open(cls, cfg: dict, key: str, folder: Path, need, concurrent: int) -> "_Parent":
        """The parent run, with the sweep's lease (orchard/leases.py): the same sweep already
        driven by a live process, on this machine or another, raises ``LeaseHeld`` before
        anything is touched. On this machine a file lock makes "read the state, open the
        parent, take the lease" one step for two commands started together. Saved Tune state
        that fails its seal raises ``sweep_seal.Unsealed``, also before anything is touched.
        With ``tracking=none`` there is no store to hold the lease: a lock on the sweep's
        folder holds it (``leases.take_local``: this machine only)."""
        from filelock import FileLock

        from orchard import leases
        from orchard.tracking import mlflow_run as tracking
        from orchard.tracking import store as tracking_store
        from orchard.tracking.lost_runs import Heartbeat

        what = f"sweep {key}"
        if not cfg["tracking"]["enabled"]:
            lease = leases.take_local(folder, what)
            return cls(None, None, lease, _checked(restorable, cfg, lease))
        state_file = folder / "orchard_sweep.json"
        uri = tracking_store.resolve_uri(cfg["tracking"]["uri"])
        with FileLock(str(folder / ".orchard_sweep.lock"), timeout=120):
            previous = json.loads(state_file.read_text()).get("parent_run_id") if state_file.exists() else None
            lease = None
            if previous and _exists(previous, uri):
                lease = leases.take(tracking.TrackedRun(previous, "", uri).client(), previous, what)
            sealed = _checked(restorable, cfg, lease)  # read after the lease: the state is ours now
            tracked = _reopen(previous, uri) if lease is not None and sealed is not None else None
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


def _exists(run_id: str, uri: str) -> bool:
    from mlflow.exceptions import MlflowException

    from orchard.tracking import mlflow_run as tracking

    try:
        tracking.TrackedRun(run_id, "", uri).client().get_run(run_id)
        return True
    except MlflowException:
        return False


def _state(cfg: dict):
    """Tune's experiment folder as a ``Storage``."""
    from orchard.storage import Storage

    return Storage(tune_path(cfg))


def restorable(cfg: dict) -> dict | None:
    """The sealed files of this sweep's saved Tune state, checked (orchard/sweep_seal.py), or
    None when Tune saved none; raises ``sweep_seal.Unsealed`` for state this user did not seal.
    Only a file's presence is asked before the check: Tune's ``can_restore`` reads no content."""
    from ray import tune

    if not tune.Tuner.can_restore(str(tune_path(cfg))):
        return None
    return sweep_seal.verify(_state(cfg))


def _checked(check: Callable, cfg: dict, lease):
    """``check(cfg)``, giving the lease back if it raises (the sweep then touches nothing)."""
    try:
        return check(cfg)
    except BaseException:
        if lease is not None:
            lease.release()
        raise


def _staging(trials: list) -> Path | None:
    """Tune's local copy of the experiment folder, written by this driver alone: what it uploads
    to storage (Ray's ``experiment_driver_staging_path``); None without trials."""
    try:
        return Path(trials[0].storage.experiment_driver_staging_path) if trials else None
    except Exception:
        return None


def _seal(cfg: dict, sealed: dict | None, staging: Path | None) -> None:
    """Seal what this driver wrote: the files sealed before (those still there: Tune may remove
    some, never add one this way), ``tuner.pkl``, and Tune's staging copy."""
    if staging is None or not staging.is_dir():
        say("orchard: the sweep's Tune state could not be sealed (no staging copy): the same command "
            "will not resume it", file=sys.stderr)
        return
    state = _state(cfg)
    try:
        present = set(sweep_seal.stored_names(state))
        files = {rel: d for rel, d in (sealed or {}).items() if rel in present}
        sweep_seal.seal(state, {**files, **sweep_seal.local_digests(staging)})
    except (OSError, sweep_seal.Unsealed) as exc:
        say(f"orchard: the sweep's Tune state could not be sealed ({exc}): the same command will not "
            "resume it", file=sys.stderr)


def _reopen(run_id: str | None, uri: str):
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


def _saved_statuses(staging: Path | None) -> dict[str, str]:
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


def _trial_error(trial) -> str:
    """The last line of the trial's error: Tune's error.txt (text, never its pickled error)."""
    try:
        lines = [line.strip() for line in str(trial.get_error() or "").splitlines() if line.strip()]
    except Exception:  # the trial's storage is gone
        lines = []
    return lines[-1][:300] if lines else "see the trial's error.txt"


def failure_lines(failed: list) -> list[str]:
    """One line per distinct cause among the failed trials, the most frequent first: how many
    failed of it and the cause (the last line of the first one's error)."""
    causes: dict[str, list] = {}
    for trial in failed:
        causes.setdefault(_trial_error(trial), []).append(trial)
    return [f"{len(ts)} trial(s) failed ({', '.join(str(t.trial_id) for t in ts[:3])}{', ...' if len(ts) > 3 else ''}): "
            f"{cause}" for cause, ts in sorted(causes.items(), key=lambda kv: -len(kv[1]))]


def leaderboard(trials, keys: list[str], metric: str, mode: str) -> list[dict]:
    """The trials that finished, best first: ``{trial, params, metric, run_id}``."""
    rows = []
    for trial in trials:
        m = trial.last_result or {}
        if trial.status != "TERMINATED" or FINAL not in m or metric not in m:
            continue
        rows.append({"trial": str(trial.trial_id), "params": {k: trial.config.get(k) for k in keys},
                     "metric": float(m[metric]), "run_id": m.get("run_id", "")})
    rows.sort(key=lambda r: rank_key(r["metric"], mode))
    return rows


def rank_key(value: float, mode: str) -> tuple:
    """Sort key of a trial's metric, best first for ``mode`` (min | max): a non-finite value
    (NaN or inf, a trial that diverged) ranks last whatever the mode, never best."""
    if not math.isfinite(value):
        return (1, 0.0)
    return (0, -value if mode == "max" else value)


def best_row(rows: list[dict]) -> dict | None:
    """The best row of a ``leaderboard``, or None when no trial's metric is finite."""
    return rows[0] if rows and math.isfinite(rows[0]["metric"]) else None


def no_best_line(rows: list[dict], metric: str) -> str:
    return (f"no best trial: the {metric} of every one of the {len(rows)} finished trial(s) is NaN or inf "
            f"(training diverged); nothing registered")


def format_leaderboard(rows: list[dict], metric: str, parent_id: str | None) -> str:
    if not rows:
        return "orchard: no trial finished"
    keys = list(rows[0]["params"])
    header = ["rank", *keys, metric, "mlflow run"]
    table = [[str(i + 1), *[f"{r['params'][k]:.4g}" if isinstance(r["params"][k], float) else str(r["params"][k]) for k in keys],
              f"{r['metric']:.6g}", r["run_id"][:12]] for i, r in enumerate(rows)]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table]
    if parent_id:
        lines.append(f"sweep run: {parent_id} (children hold each trial)")
    return "\n".join(lines)
