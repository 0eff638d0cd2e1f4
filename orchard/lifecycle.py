"""The run lifecycle: every way a run starts (the CLI, ``--multirun``, sweeps, ``resume``) goes
through this module, so every run ends the same way, with its true status and exit code.

    [1] prepare    compose + validate the config                       nothing started yet
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

import json
import os
import shlex
import socket
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchard import config as config_lib
from orchard import background, console, interrupts, redact, registry
from orchard.console import say
from orchard.errors import ConfigError, Diverged
from orchard.outcome import Outcome
from orchard.time_split import TimeSplit


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
        from orchard.sweep import validate_sweep

        validate_sweep(cfg)
    return cfg, module


# --------------------------------------------------------------------------- [2] preflight
def preflight(cfg: dict, module=None) -> None:
    """Everything that can be checked before Ray starts and a run opens; raises ConfigError.
    With the workload's ``module``, also that its workers fit the machine an embedded Ray would
    have (``check_fits``), so a run that cannot fit is refused in seconds, not after a Ray start."""
    _check_output_dir(cfg["output_dir"])
    _check_ray_auth(cfg["cluster"])
    if cfg["cluster"]["mode"] == "remote":  # first: a 5 s probe, before a store is created or migrated
        _check_cluster_address(cfg["cluster"]["address"], cfg["cluster"])
    elif module is not None:
        from orchard.cluster.ray_private import detected_resources

        have = detected_resources()
        have.update({k.upper(): float(cfg["cluster"][f"num_{k}"]) for k in ("cpus", "gpus")
                     if cfg["cluster"].get(f"num_{k}") is not None})
        check_fits(cfg, module, have)
    from orchard import storage

    storage.check(cfg)  # storage.uri (s3://...) writable with the AWS_* variables given
    _check_fresh_run_folder(cfg)
    if cfg["tracking"]["enabled"]:
        from orchard.tracking.store import check_store

        check_store(cfg["tracking"]["uri"])


def _check_ray_auth(cluster: dict) -> None:
    """Ray listens on every interface, even embedded, and runs whatever code reaches its ports:
    its token is the door (on by default in Ray 2.60). Ray keeps it only while ``RAY_AUTH_MODE``
    is unset or exactly ``token``; any other value (``disabled``, ``off``, ``Token``, empty) turns
    it off, so any other value gets one line instead of an open port, unless
    ``cluster.allow_unauthenticated=true`` says it is meant (an isolated network)."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode not in (None, "token") and not cluster.get("allow_unauthenticated"):
        raise ConfigError("cluster.allow_unauthenticated", f"true to run Ray without its token (RAY_AUTH_MODE={mode!r} "
                          "is set, and Ray keeps its token only while it is unset or 'token': its ports, open on every "
                          "interface, would run anyone's code); or unset RAY_AUTH_MODE")


def _check_fresh_run_folder(cfg: dict) -> None:
    """A new run never trains on from another run's checkpoints by accident: a folder the user
    named (``hydra.run.dir``) that an earlier run already trained in is refused, not shared
    (Ray Train would restore whatever its storage holds). Only ``resume`` continues a run."""
    if not cfg.get("_run_dir") or config_lib.RUN_ID in cfg["_run_dir"] or cfg.get("_resumes"):
        return  # a folder named by the run's own id is new by construction
    from orchard.storage import Storage

    kept = Storage.for_run(cfg, Path(cfg["_run_dir"]).resolve())
    if kept.exists():
        raise ConfigError("hydra.run.dir", f"a folder no earlier run trained in; {cfg['_run_dir']} holds a run's "
                          f"checkpoints ({kept.uri}): continue it with python -m orchard resume <its run id>, "
                          "or name another folder")


def _check_output_dir(output_dir: str) -> None:
    try:
        config_lib.ensure_writable(Path(os.path.expanduser(str(output_dir))))
    except OSError as exc:
        raise ConfigError("output_dir", f"a folder orchard can create and write; {str(output_dir)!r}: "
                          f"{exc.strerror or exc}") from None


def _check_cluster_address(address: str, cluster: dict, timeout_s: float = 5.0) -> None:
    """A Ray cluster must answer at ``address`` (host:port, ray://host:port) or be found (auto),
    and a cluster reached at its GCS address must ask for Ray's token (``_check_cluster_auth``)."""
    if address in (None, "auto"):
        # Ray's own lookup order: RAY_ADDRESS, then the cluster `ray start` last left on this
        # machine; that file outlives its cluster, so the address it names is checked below.
        latest = Path("/tmp/ray/ray_current_cluster")
        found = os.environ.get("RAY_ADDRESS") or (latest.read_text().strip() if latest.exists() else "")
        if not found or found == "auto":
            raise ConfigError("cluster.address", "auto needs a Ray cluster on this machine (ray start --head) "
                              "or RAY_ADDRESS; none found. Give host:6379 or ray://host:10001")
        address = found
    hostport = str(address).split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or hostport, int(port or 6379)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise ConfigError("cluster.address", f"a Ray cluster that answers; none did at {address} "
                          f"({getattr(exc, 'strerror', None) or exc})") from None
    if "://" not in str(address):
        _check_cluster_auth(f"{host or hostport}:{int(port or 6379)}", cluster)


def _check_cluster_auth(gcs_address: str, cluster: dict) -> None:
    """A cluster on another machine started without token auth (its head without a token, or
    with ``RAY_AUTH_MODE=disabled``) is refused like starting one: its ports run the code of anyone
    who reaches them, the run's included. One on this machine (a ``ray start`` or
    ``cluster_utils.Cluster`` of the user's own, for trying things) gets one line saying so and
    is used. A ``ray://`` address reaches Ray Client's server, whose GCS port the client does not
    know: not probed (docs/cluster.md, "Security")."""
    import grpc

    from orchard.cluster import ray_private

    if cluster.get("allow_unauthenticated"):
        return
    try:
        open_door = ray_private.answers_without_token(gcs_address)
    except grpc.RpcError:
        return  # not a GCS that answers this RPC (an older Ray, a proxy): Ray's own connect decides
    if not open_door:
        return
    if _on_this_machine(gcs_address.rpartition(":")[0]):
        say(f"orchard: the Ray cluster at {gcs_address} runs without token auth: anyone who reaches its ports "
            "can run code there (docs/cluster.md, 'Starting a cluster with token auth on')", file=sys.stderr)
        return
    raise ConfigError("cluster.allow_unauthenticated", f"true to attach to {gcs_address}, a Ray cluster without "
                      "token auth (it answers without a token: its ports run anyone's code); or restart it with "
                      "auth on (docs/cluster.md, 'Starting a cluster with token auth on')")


def _on_this_machine(host: str) -> bool:
    """``host`` names this machine: a loopback address or one of its interfaces' addresses."""
    import ipaddress

    import psutil

    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    own = {a.address.split("%")[0] for nics in psutil.net_if_addrs().values() for a in nics}
    return all(ipaddress.ip_address(a).is_loopback or a in own for a in addresses)


# --------------------------------------------------------------------------- [3] session
class RayStartError(RuntimeError):
    """Ray could not be started or attached (no run was opened)."""


@contextmanager
def ray_session(cfg: dict):
    """Ray started (embedded) or attached for the duration; stopped only if started here."""
    from orchard import cluster

    try:
        started = cluster.connect(cfg["cluster"], elastic=bool((cfg.get("strategy") or {}).get("min_workers")))
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


def check_fits(cfg: dict, module, have: dict | None = None) -> None:
    """The workers a run starts all at once (a Ray Train group, SPREAD actors: the workload's
    ``resources(cfg).outside``) must fit the embedded Ray, or they would wait forever for a
    placement group; raises ConfigError.  ``have``: the resources Ray will have (preflight,
    before it starts), else the running Ray's.  Attached clusters may autoscale: not checked."""
    import ray

    resources_fn = getattr(module, "resources", None)
    if resources_fn is None or cfg["cluster"]["mode"] != "local":
        return
    try:
        outside = resources_fn(cfg).outside
    except ray.exceptions.RaySystemError:
        if have is None:
            raise
        return  # a workload that sizes its groups to the running Ray (singa) is checked once it is up
    need: dict[str, float] = {}
    for bundle in outside:
        for key, value in bundle.items():
            need[key] = need.get(key, 0.0) + float(value)
    if have is None:
        have = ray.cluster_resources()
    short = [f"{value:g} {key} (this machine's Ray has {float(have.get(key, 0)):g})"
             for key, value in need.items() if value > float(have.get(key, 0)) + 1e-9]
    if short:
        raise ConfigError("strategy", f"workers that fit this machine; they need {', '.join(short)} at once: "
                          "lower strategy.num_workers / cpus_per_worker / gpus_per_worker, or raise cluster.num_cpus")


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
    module = module or registry.load(cfg["workload"]["name"])
    split = TimeSplit()  # a single run's split starts here: Ray's start is part of its time
    try:
        with interrupts.raising():
            # again once Ray is up: ray.init installs a SIGTERM handler of its own (sys.exit)
            with ray_session(cfg), interrupts.raising():
                split.mark("ray_start")
                try:
                    check_fits(cfg, module)
                except ConfigError as err:
                    say(f"orchard: bad config: {err}", file=sys.stderr)
                    return Outcome(2, None, {}, str(err))
                reap_lost_runs(cfg)
                if cfg.get("sweep"):
                    from orchard.sweep import run_sweep

                    return run_sweep(cfg, module, run_one)
                return run_one(cfg, module, time_split=split)
    except RayStartError as err:
        say(f"orchard: {err}", file=sys.stderr)
        return Outcome(1, None, {}, str(err))
    except KeyboardInterrupt as exc:  # before the run opened, or while Ray stopped
        stopped = interrupts.as_interrupted(exc)
        say(f"orchard: {stopped}", file=sys.stderr)
        return Outcome(stopped.exit_code, None, {}, str(stopped))


# --------------------------------------------------------------------------- [4] run_one
def default_run_name(cfg: dict) -> str:
    return cfg.get("run_name") or f"{cfg['workload']['name']}-{cfg['strategy']['name']}-{time.strftime('%y%m%d-%H%M%S')}"


def run_one(cfg: dict, module, parent_run_id: str | None = None, on_metrics=None, quiet: bool = False,
            time_split: TimeSplit | None = None) -> Outcome:
    """One tracked run of the workload ``module`` (its entry for the mode: registry.entry) on a running Ray session.

    ``time_split``: the run's split begun before it (``execute``: with Ray's start); a sweep's
    trial or a multirun's job begins its own here."""
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
            trial = cfg.get("_trial")  # a sweep's trial (orchard/sweep.py): its retry finds its run by these
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
                say(f"orchard: MLflow run {tracked.run_id} at {_tracking_address(tracked.tracking_uri)}")
        run_id = tracked.run_id if tracked else None
        run_dir = _run_folder(cfg, run_id, name, trial=parent_run_id is not None)
        if tracked:  # now, not through the metrics sink: a driver killed in its first seconds leaves a resumable run
            retried(tracked.client().set_tag, run_id, "orchard.run_dir", str(run_dir))
    status, error, metrics, exit_code = "FINISHED", None, {}, 0
    live = None
    signals_before = len(interrupts.received)
    log_start = console.mark_run_start()
    try:
        live = _start_run_services(cfg, tracked, run_id, run_dir, on_metrics, split)
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
        summary = _close(live, tracked, heartbeat, status, error, metrics, split, (log_start, run_dir))
    if "close" not in split.parts:  # the final metrics never went out (no sink, a store away)
        split.mark("close")
    metrics = {**summary, **metrics, **split.metrics(), "time/total_s": split.total()}
    if isinstance(error, KeyboardInterrupt):
        say(f"orchard: {error}; run {run_id or name} marked KILLED", file=sys.stderr)
    elif isinstance(error, ConfigError):
        say(f"orchard: bad config: {error}" + (f" (run {run_id} marked FAILED)" if tracked else ""), file=sys.stderr)
    elif isinstance(error, Diverged):  # one line: where, and the key to change (orchard/divergence.py)
        say(f"orchard: {cfg['workload']['name']} diverged: {error}" + (f" (run {run_id} marked FAILED)" if tracked else ""),
            file=sys.stderr)
    elif error is not None:
        say(f"orchard: {cfg['workload']['name']} failed: {type(error).__name__}: {_one_line(error)}", file=sys.stderr)
        if tracked:
            say(f"orchard: run {run_id} marked FAILED; traceback in its artifact error.txt", file=sys.stderr)
    if not quiet:
        _print_summary(cfg, module, name, tracked, status, run_dir, metrics, error)
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


@dataclass
class _Live:
    """What a run has started besides the MLflow run: closed in reverse by ``_close``."""
    ctx: object
    sink: object
    samplers: list


def _start_run_services(cfg: dict, tracked, run_id: str | None, run_dir: Path, on_metrics, split: TimeSplit) -> _Live:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from orchard.tracking import system_metrics
    from orchard.tracking.context import RunContext
    from orchard.tracking.sink import MetricsSink, sink_name

    tcfg = cfg["tracking"]
    redact.private_folder(run_dir)
    uri = tracked.tracking_uri if tracked else None
    # The sink lives on the driver's node: a sqlite store is a file only this machine sees.
    here = ray.get_runtime_context().get_node_id()
    sink = MetricsSink.options(name=sink_name(run_id or run_dir.name), scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(
        uri, run_id, tcfg.get("flush_interval_s", 1.0), max_series=tcfg.get("max_series_points", 10_000))
    from orchard.storage import Storage

    ctx = RunContext(sink, run_id, str(run_dir), cfg["workload"]["name"], cfg["strategy"]["name"], uri,
                     storage=Storage.for_run(cfg, run_dir))
    ctx._on_metrics = on_metrics
    ctx.time_split = split
    live = _Live(ctx, sink, [])
    if tcfg.get("system_metrics"):
        live.samplers = system_metrics.start_samplers(ctx, tcfg["sample_interval_s"])
    return live


def _run_workload(cfg: dict, module, live: _Live, quiet: bool) -> dict:
    from orchard.progress import ProgressLine

    plain = {k: v for k, v in cfg.items() if not k.startswith("_")}
    label = f"{cfg['workload']['name']}/{cfg['strategy']['name']}"
    with ProgressLine(live.sink, label, "never" if quiet else cfg.get("progress", "auto")):
        return dict(registry.entry(module, cfg["mode"])(plain, live.ctx) or {})


def _record_headline(cfg: dict, module, tracked, metrics: dict) -> None:
    """The workload's headline figure as ``headline/<name>`` (logged with the final metrics) and
    its headline line at the end of the run's description, for the MLflow UI's runs table."""
    from orchard import summary

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


# How long closing a run waits for the metrics sink while the store is busy: for the system
# series and for the final metrics, each; then for its last flush (retried inside the sink).
SINK_CALL_TIMEOUT_S = 60
SINK_CLOSE_TIMEOUT_S = 120
CLOSE_BUDGET_S = 2 * SINK_CALL_TIMEOUT_S + SINK_CLOSE_TIMEOUT_S


def _close(live: _Live | None, tracked, heartbeat, status: str, error, metrics: dict, split: TimeSplit,
           log_part: tuple[int, Path] | None = None) -> dict:
    """Stop samplers, log the final metrics at the run's last step, flush, end the MLflow run.

    The time split ends as the final metrics go out (``close``: from the workload's last mark to
    here); the sink's last flush and the MLflow run's end come after it, outside ``time/total_s``.
    Each step is guarded: whatever fails here, the run still ends with its true status."""
    import ray

    from orchard.tracking import mlflow_run as tracking
    from orchard.tracking import system_metrics

    summary: dict = {}
    if live is not None:
        try:
            system_metrics.stop_samplers(live.samplers)
        except Exception as exc:
            say(f"orchard: resource samplers did not stop cleanly: {exc}", file=sys.stderr)
        try:
            series = ray.get(live.sink.series.remote("system/"), timeout=SINK_CALL_TIMEOUT_S)
            summary = system_metrics.summarize(series)
            final = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
            split.mark("close")
            ray.get(live.sink.log_final.remote({**summary, **final, **split.metrics(), "time/total_s": split.total()},
                                               int(time.time() * 1000)), timeout=SINK_CALL_TIMEOUT_S)
            ray.get(live.sink.close.remote(), timeout=SINK_CLOSE_TIMEOUT_S)
        except Exception as exc:
            say(f"orchard: final metrics not all recorded: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        try:
            ray.kill(live.sink)
        except Exception:
            pass
    if heartbeat is not None:
        heartbeat.stop()
    if log_part is not None:
        try:  # this run's part of the console log: in its folder and beside its metrics
            kept = console.copy_run_part(log_part[0], log_part[1] / "orchard.log")
            if kept is not None and tracked:
                tracked.client().log_artifact(tracked.run_id, str(kept))
        except Exception as exc:
            say(f"orchard: the run's log was not kept: {exc}", file=sys.stderr)
    if tracked and _stopped_by_sweep(tracked):
        return summary  # its sweep's scheduler stopped it and closed it KILLED, with the reason
    if tracked and status == "FINISHED":
        try:  # the model's page shows what it scored, on which data
            from orchard.logged_models import link_quality

            link_quality(tracked.client(), tracked.run_id)
        except Exception as exc:
            say(f"orchard: the model's metrics were not linked to it: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    if tracked:
        try:
            tracking.close_run(tracked, status, error)
        except Exception as exc:  # the reaper will close it ("driver lost") once this process is gone
            say(f"orchard: could not record the run's status {status}: {exc}", file=sys.stderr)
    return summary


def _stopped_by_sweep(tracked) -> bool:
    from orchard.sweep import STOPPED_TAG

    try:
        return STOPPED_TAG in tracked.client().get_run(tracked.run_id).data.tags
    except Exception:  # the store cannot answer: close it as usual
        return False


def _print_summary(cfg: dict, module, name: str, tracked, status: str, run_dir: Path, metrics: dict,
                   error: BaseException | None = None) -> None:
    from orchard import summary

    label = f"{cfg['workload']['name']}/{cfg['strategy']['name']}"
    took = metrics.get("time/total_s")
    title = f"orchard {label}: {name}  {status}" + (f" in {took:,.1f} s" if isinstance(took, (int, float)) else "")
    footer = [f"run dir:   {run_dir}"]
    if tracked:
        n = sum(isinstance(v, (int, float)) for v in metrics.values())
        footer.append(f"MLflow:    run {tracked.run_id} (experiment {tracked.experiment_id}), {n} metrics, the run's log and artifacts")
        figures = _figure_names(tracked)
        if figures:
            footer.append(f"figures:   {', '.join(figures)} (artifacts figures/)")
        if isinstance(error, Diverged):  # the same config would diverge again: not without a change
            footer.extend(_diverged_hint(cfg, module, tracked.run_id, error))
        elif status in ("KILLED", "FAILED") and hasattr(module, "resume"):
            footer.append(f"resume:    python -m orchard resume {tracked.run_id}" + _resume_args(cfg))
        footer.extend(summary.view_lines(tracked.tracking_uri, tracked.experiment_id, tracked.run_id))  # last: the run's page
    say(summary.render(title, summary.headline(module, cfg, metrics), metrics, footer))


def _diverged_hint(cfg: dict, module, run_id: str, error: Diverged) -> list[str]:
    """How to go on after a run diverged: resume from its last finite checkpoint with a new
    value for the key, or (none kept) run again with one; never the same config again."""
    if not error.key:  # no single config key sets it: the console line says what to change
        return [f"resume:    after that change: python -m orchard resume {run_id}" + _resume_args(cfg)] \
            if error.checkpoint and hasattr(module, "resume") else []
    resumable = run_id if error.checkpoint else cfg.get("_resumes")  # else the run this one resumed
    if resumable and hasattr(module, "resume"):
        return [f"resume:    with a lower {error.key}: python -m orchard resume {resumable} {error.key}=..." + _resume_args(cfg)]
    typed = [o for o in cfg.get("_overrides", []) if o.split("=", 1)[0].lstrip("+~") != error.key]
    return [f"again:     with a lower {error.key} (no checkpoint before it diverged): "
            f"python -m orchard {shlex.join(typed)} {error.key}=..."]


def _figure_names(tracked) -> list[str]:
    """The run's figures (PNG artifacts under figures/), by name, for the summary."""
    try:
        found = tracked.client().list_artifacts(tracked.run_id, "figures")
    except Exception:  # an artifact store that cannot list: the UI still shows them
        return []
    return sorted(Path(a.path).stem for a in found if a.path.endswith(".png"))


def _tracking_address(uri: str) -> str:
    """The tracking store as a user opens it: a server's URL as it is, a local store with the UI
    command that serves it."""
    from orchard.tracking import store as tracking_store

    return uri if uri.startswith(("http://", "https://")) else f"{uri} (view: {tracking_store.ui_command(uri)})"


def _resume_args(cfg: dict) -> str:
    """What ``python -m orchard resume <id>`` needs after the id: the store (unless the default),
    and what this run was given that a resume does not take back from the store (config folders,
    and overrides off ``from_the_store``'s allow-list), masked as recorded."""
    from orchard import from_the_store

    uri = cfg["tracking"]["uri"]
    given = [] if uri == "sqlite:///mlflow.db" else [f"tracking.uri={uri}"]
    again = given + from_the_store.held_back(redact.overrides(cfg.get("_overrides", [])), given)
    return "".join(f" {shlex.quote(o)}" for o in again) + "".join(
        f" --config-dir {shlex.quote(d)}" for d in registry.user_config_dirs())


# --------------------------------------------------------------------------- resume
