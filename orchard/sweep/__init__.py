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

import signal
import sys
from typing import Callable

from orchard.errors import ConfigError
from orchard.outcome import Outcome
from orchard.sweep import seal as sweep_seal
from orchard.sweep.leaderboard import (best_row, failure_lines, format_leaderboard, leaderboard, no_best_line,
                                       trial_error)
from orchard.sweep.parent_run import ParentRun
from orchard.sweep.saved_state import (saved_state_of, saved_statuses, seal_state, staging_of, sweep_dir, sweep_key,
                                       tune_path)
from orchard.sweep.space import anchored, param_space, trial_count, trial_resources
from orchard.sweep.trials import make_trainable, scheduler_of, trial_progress, trial_stopper
from orchard.terminal import interrupts
from orchard.terminal.console import say


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
        cluster = ray.cluster_resources()
        concurrent = need.max_concurrent(cluster, s.get("max_concurrent_trials"))
        # trials that share a GPU: as many at once as its memory holds (gpu_fit.py)
        gpu_share, gpus = need.per_trial().get("GPU", 0.0), cluster.get("GPU", 0.0)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        return Outcome(2, None, {}, str(err))
    folder.mkdir(parents=True, exist_ok=True)
    exp_path = tune_path(cfg)  # Tune's experiment state: in the run storage (s3://... on a cluster)
    from orchard.tracking.leases import LeaseHeld

    try:
        parent = ParentRun.open(cfg, key, folder, need, concurrent)
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
    trainable = tune.with_resources(make_trainable(anchored(cfg), module.__name__, parent.run_id, metric, run_one),
                                    need.factory())
    fits_memory = (" (one, until a trial's GPU memory is measured)"
                   if s.get("fit_gpu_memory", True) and 0 < gpu_share < 1 and concurrent > 1 else "")
    say(f"orchard: sweep {key} {'resuming' if resuming else 'starting'} in {folder}\n"
          f"orchard: up to {concurrent} trial(s) at once{fits_memory}; each holds {need.describe()}\n"
          f"orchard: stopped or interrupted, the same command resumes it", flush=True)
    signals_before = len(interrupts.received)
    stopper = trial_stopper(parent, s["scheduler"], metric, signals_before)
    if resuming:
        tuner = tune.Tuner.restore(str(exp_path), trainable=trainable, resume_unfinished=True,
                                   resume_errored=True, restart_errored=False)
        # Tune restores the scheduler saved with the sweep; this session's limit replaces it (the
        # cluster, or sweep.max_concurrent_trials, may have changed). Through Ray Client the tuner
        # lives on the cluster: the saved one, with its first session's limit, holds there.
        if getattr(tuner, "_local_tuner", None) is not None:
            tuner._local_tuner._tune_config.scheduler = scheduler_of(s, concurrent, gpu_share, gpus)
    else:
        tuner = tune.Tuner(
            trainable, param_space=param_space(s["params"]),
            tune_config=tune.TuneConfig(metric=metric, mode=mode, num_samples=s["num_samples"],
                                        max_concurrent_trials=concurrent,
                                        scheduler=scheduler_of(s, concurrent, gpu_share, gpus)),
            run_config=tune.RunConfig(name="tune", storage_path=exp_path.rsplit("/", 1)[0], verbose=0,
                                      callbacks=[stopper, trial_progress(trial_count(s), metric, mode)],
                                      # a trial whose actor dies (its node lost) is run again (retry_of)
                                      failure_config=tune.FailureConfig(max_failures=s.get("max_failures", 2))),
        )
        sealed = {"tuner.pkl": sweep_seal.digest(saved_state_of(cfg).read_bytes("tuner.pkl"))}  # written just now, by us
    grid, second_signal = None, None
    try:
        grid = tuner.fit()  # Tune's own SIGINT handler stops it gracefully; it then returns
    except KeyboardInterrupt as exc:  # a second Ctrl-C, once Tune gave SIGINT back
        second_signal = exc
    trials = list(grid._experiment_analysis.trials) if grid is not None else []
    staging = staging_of(trials)
    seal_state(cfg, sealed, staging)
    # Once stopped, Tune marks the trials it cut TERMINATED in memory; the state it saved just
    # before says RUNNING (or PENDING) for them.
    unfinished = [tid for tid, status in saved_statuses(staging).items() if status not in ("TERMINATED", "ERROR")]
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
            parent.close("FAILED", f"every trial failed; first: {trial_error(failed[0])}")
    say(format_leaderboard(rows, metric, parent.run_id))
    for line in failure_lines(failed):
        say(f"orchard: {line}", file=sys.stderr)
    if not rows:
        return Outcome(1, parent.run_id, {}, "no trial finished")
    if best is None:
        say(f"orchard: {no_best_line(rows, metric)}", file=sys.stderr)
        return Outcome(1, parent.run_id, {}, no_best_line(rows, metric))
    return Outcome(0, parent.run_id, {f"best/{metric}": best["metric"]}, None)


