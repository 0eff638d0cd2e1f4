"""The run lifecycle: every way a run starts (the CLI, ``--multirun``, sweeps, ``resume``) goes
through this module, so every run ends the same way, with its true status and exit code.

    [1] prepare    compose + validate the config                       nothing started yet
                   (the workload's ``check``, which needs its heavy libraries, runs in a
                   thread while Ray starts: a ConfigError from it is exit 2, no run opened)
    [2] preflight  output_dir writable, tracking store usable (created once under a file
                   lock), cluster address answering                    ConfigError -> exit 2
    [3] session    Ray started or attached; the run's workers fit it (else exit 2, rather
                   than a placement group that waits forever); SIGINT/SIGTERM raise
                   Interrupted; runs whose driver was lost are closed ("driver lost")
    [4] run_one    MLflow run + heartbeat, metrics sink, resource samplers, the workload,
                   final metrics, summary, status

Endings (exit code, MLflow status):
    0   FINISHED   the workload returned
    1   FAILED     the workload raised; reason in tag ``orchard.error``, traceback in error.txt
    2   (no run)   bad config, unwritable output_dir, unreachable tracking store or cluster
    130 KILLED     Ctrl-C (SIGINT)
    143 KILLED     SIGTERM
A driver killed without a word (SIGKILL, OOM) leaves its run to the next start's reaper
(``orchard/tracking/lost_runs.py``), which closes it FAILED with "driver lost".
"""
from __future__ import annotations

import gc
import json
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from orchard import background
from orchard import config as config_lib
from orchard.config import redact, registry
from orchard.errors import ConfigError, Diverged
from orchard.outcome import Outcome
from orchard.run.ending import end_run, print_summary, tracking_address
from orchard.run.preflight import check_fits, preflight
from orchard.run.services import LiveServices, start_run_services
from orchard.terminal import console, interrupts
from orchard.terminal.console import say
from orchard.tracking.time_split import TimeSplit


# --------------------------------------------------------------------------- [1] prepare
def prepare(overrides: list[str]):
    """Compose + validate; raises ConfigError.  Nothing here starts Ray."""
    cfg = config_lib.compose_with_hints(overrides)
    cfg["_overrides"] = list(overrides)
    name = cfg["workload"]["name"]
    try:
        module = registry.load(name)
    except KeyError:
        raise ConfigError("workload", f"one of {', '.join(registry.names())}; got {name!r}") from None
    config_lib.validate(cfg, module)
    if cfg.get("sweep"):
        from orchard.sweep.space import validate_sweep

        validate_sweep(cfg)
    return cfg, module


# --------------------------------------------------------------------------- [3] session
class RayStartError(RuntimeError):
    """Ray could not be started or attached (no run was opened)."""


@contextmanager
def ray_session(cfg: dict):
    """Ray started (embedded) or attached for the duration; stopped only if started here."""
    from orchard import cluster

    try:
        started = cluster.connect(cfg["cluster"])
    except Exception as exc:  # e.g. a raylet that did not come up on an overloaded machine
        raise RayStartError(f"Ray did not start: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc
    try:
        yield
    finally:
        if background.running():
            # a run that stopped early (interrupted, failed) left work going: its Ray Train runs
            # end now rather than train on while the threads waiting in fit() are awaited below
            from orchard.strategies.launch import abort_train_runs

            abort_train_runs()
        # a workload thread still inside Ray when Ray stops would end the process with status 1
        still_running = background.join_all()
        if still_running:
            say(f"orchard: stopping Ray with threads still in it after {background.STOP_TIMEOUT_S:g} s: "
                f"{', '.join(still_running)}", file=sys.stderr)
        if started:
            with interrupts.deferred():
                cluster.shutdown()


def reap_lost_runs(cfg: dict) -> None:
    """Close the runs of this store whose driver died without a word (see orchard/tracking/lost_runs.py)."""
    if not cfg["tracking"]["enabled"]:
        return
    from mlflow.tracking import MlflowClient

    from orchard.tracking import lost_runs as runs
    from orchard.tracking.store import resolve_uri

    try:
        closed = runs.reap(MlflowClient(resolve_uri(cfg["tracking"]["uri"])))
    except Exception as exc:  # the store answered the preflight; a failed sweep of old runs is no reason to stop
        say(f"orchard: could not check for lost runs: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        return
    if closed:
        say(f"orchard: closed {len(closed)} run(s) whose driver was lost (FAILED): {', '.join(closed)}", file=sys.stderr)


def main(cfg: dict, module, print_cfg: bool = False) -> int:
    """The whole lifecycle for one composed config (single run or sweep); returns the exit code."""
    try:
        preflight(cfg, module)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        return 2
    open_console(cfg)
    return execute(cfg, module).exit_code


def open_console(cfg: dict) -> None:
    """From here on the terminal shows orchard's lines only (unless ``verbose``): the config in
    one line first, and where everything else goes."""
    where = ""
    if not cfg.get("verbose"):
        logs = cfg.get("logs") or {}
        log = console.quiet(Path(cfg["output_dir"]).resolve() / "logs", max_bytes=int(logs.get("max_mb", 64) * 2**20),
                            backups=logs.get("backups"))
        where = f"  (Ray, Train, torch lines: {log}; verbose=true or -v shows them here)"
    choices = cfg.get("_choices") or {}
    picked = " ".join(f"{g}={choices[g]}" for g in ("workload", "strategy", "cluster", "tracking", "sweep",
                                                      "experiment", "debug") if choices.get(g))
    own = [redact.override(o) for o in cfg.get("_overrides", []) if o.split("=", 1)[0].lstrip("+~") not in choices]
    say(f"orchard: {picked or cfg['workload']['name']}" + (f"  {' '.join(own)}" if own else "") + where)


def execute(cfg: dict, module=None) -> Outcome:
    """Run a validated config end to end (or its sweep) and return the outcome."""
    from orchard.tracking.store import StoreOpening

    module = module or registry.load(cfg["workload"]["name"])
    split = TimeSplit()  # a single run's split starts here: Ray's start is part of its time
    # the store opens while Ray starts (preflight checked what it could without MLflow), and the
    # workload's side process imports on what CPU they leave (a sweep's trials start their own)
    opening = StoreOpening(cfg["tracking"]["uri"] if cfg["tracking"]["enabled"] else None)
    side = None if cfg.get("sweep") else side_process(cfg, module)
    # the workload's check too (singa builds its net): a ConfigError from it ends this before a run opens
    checking = None if cfg.get("_checked") else background.start(config_lib.check, cfg, module, name="orchard-check")
    try:
        with interrupts.raising():
            # again once Ray is up: ray.init installs a SIGTERM handler of its own (sys.exit)
            with ray_session(cfg), interrupts.raising():
                split.mark("ray_start")
                try:
                    opening.wait()
                    if checking is not None:
                        checking.result()
                    # what is alive now is modules (Ray, MLflow, SQLAlchemy, Hydra), not the run's
                    # objects: frozen until the run ends, the full collection at Ray's stop
                    # (cluster.shutdown), which must find the run's unfinished Ray Data
                    # iterators, scans only what the run made (0.4-0.5 s less on 2 cores)
                    gc.freeze()
                    check_fits(cfg, module)
                except ConfigError as err:
                    say(f"orchard: bad config: {err}", file=sys.stderr)
                    return Outcome(2, None, {}, str(err))
                reap_lost_runs(cfg)
                if cfg.get("sweep"):
                    from orchard.sweep import run_sweep

                    return run_sweep(cfg, module, run_one)
                return run_one(cfg, module, time_split=split, side=side)
    except RayStartError as err:
        opening.wait_quietly()  # a store half made when the process ends would be worse than none
        bad = checking.exception() if checking is not None else None
        if isinstance(bad, ConfigError):  # the config's fault first: Ray may have failed for want of it
            say(f"orchard: bad config: {bad}", file=sys.stderr)
            return Outcome(2, None, {}, str(bad))
        say(f"orchard: {err}", file=sys.stderr)
        return Outcome(1, None, {}, str(err))
    except KeyboardInterrupt as exc:  # before the run opened, or while Ray stopped
        stopped = interrupts.as_interrupted(exc)
        say(f"orchard: {stopped}", file=sys.stderr)
        return Outcome(stopped.exit_code, None, {}, str(stopped))
    finally:
        if side is not None:  # the run stopped it as it ended; here if no run took it (bad config, Ray down)
            side.stop()
        gc.unfreeze()  # collectable again: a notebook's next run, a multirun's next job


def side_process(cfg: dict, module):
    """The workload's side process for a train run (``background.SideProcess`` with the imports
    its ``SIDE_IMPORTS`` names), or None: most workloads name none."""
    imports = getattr(module, "SIDE_IMPORTS", ())
    if not imports or cfg.get("mode", "train") != "train":
        return None
    return background.SideProcess(tuple(imports))


# --------------------------------------------------------------------------- [4] run_one
def default_run_name(cfg: dict) -> str:
    return cfg.get("run_name") or f"{cfg['workload']['name']}-{cfg['strategy']['name']}-{time.strftime('%y%m%d-%H%M%S')}"


def run_one(cfg: dict, module, parent_run_id: str | None = None, on_metrics=None, quiet: bool = False,
            time_split: TimeSplit | None = None, side=None) -> Outcome:
    """One tracked run of the workload ``module`` (its entry for the mode: registry.entry) on a running Ray session.

    ``time_split``: the run's split begun before it (``execute``: with Ray's start); a sweep's
    trial or a multirun's job begins its own here. ``side``: the workload's side process started
    with Ray (``execute``); a sweep's trial starts its own here. The run stops it as it ends
    (``ctx.side`` while it runs)."""
    from orchard.tracking import mlflow_run as tracking

    split = time_split or TimeSplit()
    name = default_run_name(cfg)
    tcfg = cfg["tracking"]
    tracked, heartbeat = None, None
    # Opening is atomic for signals: a run either does not exist or is closed with its status.
    with interrupts.deferred(reraise=True):
        if tcfg["enabled"]:
            extra = {"orchard.overrides": json.dumps(redact.overrides(cfg.get("_overrides", []))),
                     "orchard.started_at": f"{split.started_at:.3f}"}  # the time split's start, wall clock
            if registry.user_config_dirs():  # --config-dir: resume names them (it never adds them by itself)
                extra["orchard.config_dirs"] = json.dumps(registry.user_config_dirs())
            if cfg.get("_resumes"):
                extra["orchard.resumes"] = cfg["_resumes"]
            trial = cfg.get("_trial")  # a sweep's trial (orchard/sweep/trials.py): its retry finds its run by these
            if trial:
                extra.update({"orchard.trial_id": trial["id"], "orchard.sweep_session": trial["session"]})
            if trial and trial.get("reopen"):  # the retry of an attempt lost with its node: the same run
                tracked = tracking.reopen_run(cfg, trial["reopen"], trial["attempt"], extra_tags=extra)
            else:
                tracked = tracking.open_run(cfg, name, parent_run_id, extra_tags=extra)
            from orchard.tracking.lost_runs import Heartbeat
            from orchard.tracking.store import retried

            heartbeat = Heartbeat(tracked.client(), tracked.run_id)
            if not quiet:  # where to watch it while it runs (a team's server, or the local store)
                say(f"orchard: MLflow run {tracked.run_id} at {tracking_address(tracked.tracking_uri, tracked.run_id)}")
        run_id = tracked.run_id if tracked else None
        run_dir = _run_folder(cfg, run_id, name, trial=parent_run_id is not None)
        if tracked:  # now, not through the metrics sink: a driver killed in its first seconds leaves a resumable run
            retried(tracked.client().set_tag, run_id, "orchard.run_dir", str(run_dir))
    status, error, metrics, exit_code = "FINISHED", None, {}, 0
    live = None
    signals_before = len(interrupts.received)
    log_start = console.mark_run_start()
    if tracked and cfg.get("_trial") and console.log_path() is not None:
        # where this trial's part of the log is: Tune kills a trial its scheduler stops before the
        # close below copies it, and the sweep's driver copies it then (sweep/trials.py)
        retried(tracked.client().set_tag, run_id, tracking.TRIAL_LOG_TAG, f"{log_start}:{console.log_path()}")
    if side is None:  # a sweep's trial
        side = side_process(cfg, module)
    try:
        live = start_run_services(cfg, tracked, run_id, run_dir, on_metrics, split, side)
        write_hydra_folder(cfg, run_dir)
        split.mark("store_open")
        metrics = _run_workload(cfg, module, live, quiet)
        _record_headline(cfg, module, tracked, metrics)
    except KeyboardInterrupt as exc:  # a plain one (a library re-raised it): Ctrl-C
        error = interrupts.as_interrupted(exc, since=signals_before)
        status, exit_code = "KILLED", error.exit_code
    except ConfigError as exc:  # found by the workload only once its data was read: still exit 2
        status, error, exit_code = "FAILED", exc, 2
    except Exception as exc:  # the run is marked FAILED with the reason; the CLI exits 1
        status, error, exit_code = "FAILED", exc, 1
        stopped = _interrupt_behind(exc, since=signals_before)
        if stopped is not None:  # Ctrl-C first, then a library failed while it stopped: still KILLED
            status, error, exit_code = "KILLED", stopped, stopped.exit_code
    with interrupts.deferred():
        if side is not None:  # its jobs are done (the workload waited for what it needs) or not needed
            side.stop()
        summary = end_run(live, tracked, heartbeat, status, error, metrics, split, (log_start, run_dir))
    if "close" not in split.parts:  # the final metrics never went out (no sink, a store away)
        split.mark("close")
    metrics = {**summary, **metrics, **split.metrics(), "time/total_s": split.total()}
    if isinstance(error, KeyboardInterrupt):
        say(f"orchard: {error}; run {run_id or name} marked KILLED", file=sys.stderr)
    elif isinstance(error, ConfigError):
        say(f"orchard: bad config: {error}" + (f" (run {run_id} marked FAILED)" if tracked else ""), file=sys.stderr)
    elif isinstance(error, Diverged):  # one line: where, and the key to change (orchard/run/divergence.py)
        say(f"orchard: {cfg['workload']['name']} diverged: {error}" + (f" (run {run_id} marked FAILED)" if tracked else ""),
            file=sys.stderr)
    elif error is not None:
        say(f"orchard: {cfg['workload']['name']} failed: {type(error).__name__}: {_one_line(error)}", file=sys.stderr)
        if tracked:
            say(f"orchard: run {run_id} marked FAILED; traceback in its artifact error.txt", file=sys.stderr)
    if not quiet:
        print_summary(cfg, module, name, tracked, status, run_dir, metrics, error)
    return Outcome(exit_code, run_id, metrics, None if error is None else f"{type(error).__name__}: {error}")


def _run_folder(cfg: dict, run_id: str | None, name: str, trial: bool = False) -> Path:
    """The run's folder: ``hydra.run.dir`` (a multirun's job: ``hydra.sweep.dir``/``subdir``),
    ``<output_dir>/<workload>/<run id>`` unless the user named another; a sweep trial's is always that."""
    # untracked: the name's timestamp is per second, so a suffix keeps two runs apart
    folder_name = run_id or f"{name}-{uuid.uuid4().hex[:6]}"
    template = cfg.get("_run_dir")
    if trial or not template:
        return (Path(cfg["output_dir"]) / cfg["workload"]["name"] / folder_name).resolve()
    return Path(template.replace(config_lib.RUN_ID, folder_name)).resolve()


def _one_line(error: BaseException) -> str:
    """An error in one console line: a Ray task error carries the remote traceback in its text;
    its first and last lines say where and what (the whole of it is in error.txt)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1]}"


def _interrupt_behind(exc: BaseException, since: int):
    """The ``Interrupted`` an exception is a consequence of, if any: one in its chain (a library
    caught Ctrl-C and raised its own error) or a signal that reached this process during the run
    (a queue or actor torn down by the interrupt failed first)."""
    seen, link = set(), exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return interrupts.as_interrupted(link, since)
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    signals = interrupts.received[since:]
    return interrupts.Interrupted(signals[0]) if signals else None


def _run_workload(cfg: dict, module, live: LiveServices, quiet: bool) -> dict:
    from orchard.terminal.progress import ProgressLine

    plain = {k: v for k, v in cfg.items() if not k.startswith("_")}
    label = f"{cfg['workload']['name']}/{cfg['strategy']['name']}"
    with ProgressLine(live.sink, label, "never" if quiet else cfg.get("progress", "auto")):
        out = dict(registry.entry(module, cfg["mode"])(plain, live.ctx) or {})
        live.ctx.wait_for_drawings()  # a figure drawn in a task and not waited for: not lost
        return out


def _record_headline(cfg: dict, module, tracked, metrics: dict) -> None:
    """The workload's headline figure as ``headline/<name>`` (logged with the final metrics) and
    its headline line at the end of the run's description, for the MLflow UI's runs table."""
    from orchard.tracking import summary

    metrics.update(summary.headline_metrics(module, metrics))
    if tracked:
        try:
            summary.note_result(tracked.client(), tracked.run_id, module, cfg, metrics)
        except Exception as exc:  # a description is no reason to fail a run that trained
            say(f"orchard: the run's description was not updated: {str(exc).splitlines()[0][:200]}", file=sys.stderr)


def write_hydra_folder(cfg: dict, run_dir: Path) -> None:
    """``<run>/.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml``, as a ``@hydra.main``
    app leaves them: the composed config (what ran), Hydra's own node with this run's folder and
    mode, and the command-line overrides (what the user typed)."""
    import copy

    import yaml

    folder = run_dir / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    plain = redact.config({k: v for k, v in cfg.items() if not k.startswith("_")})
    typed = redact.overrides(cfg.get("_overrides", []))
    (folder / "config.yaml").write_text(yaml.safe_dump(plain, sort_keys=False))
    (folder / "overrides.yaml").write_text(yaml.safe_dump(typed))
    hydra = copy.deepcopy(cfg.get("_hydra") or {})
    hydra.setdefault("runtime", {})["output_dir"] = str(run_dir)
    hydra["mode"] = hydra.get("mode") or "RUN"
    hydra.setdefault("overrides", {})["task"] = typed
    job = hydra.setdefault("job", {})  # Hydra's own copy of the overrides, joined: masked the same way
    excluded = set(((job.get("config") or {}).get("override_dirname") or {}).get("exclude_keys") or [])
    job["override_dirname"] = ",".join(sorted(o for o in typed if o.split("=", 1)[0].lstrip("+~") not in excluded))
    (folder / "hydra.yaml").write_text(yaml.safe_dump({"hydra": redact.config(hydra)}, sort_keys=False))


