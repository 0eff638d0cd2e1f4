"""How a run ends: the close that always happens (the sink drained, metrics and the time split
logged, the MLflow run closed with its true status and reason, within ``CLOSE_BUDGET_S``) and
the summary printed after it, with the command that resumes a run that did not finish."""
from __future__ import annotations

import copy
import re
import shlex
import sys
import time
from pathlib import Path

from orchard.config import redact, registry
from orchard.errors import ConfigError, Diverged
from orchard.run.services import LiveServices
from orchard.terminal import console
from orchard.terminal.console import say
from orchard.tracking.time_split import TimeSplit

# How long closing a run waits for the metrics sink while the store is busy: for the system
# series and for the final metrics, each; then for its last flush (retried inside the sink).
SINK_CALL_TIMEOUT_S = 60
SINK_CLOSE_TIMEOUT_S = 120
CLOSE_BUDGET_S = 2 * SINK_CALL_TIMEOUT_S + SINK_CLOSE_TIMEOUT_S


def end_run(live: LiveServices | None, tracked, heartbeat, status: str, error, metrics: dict, split: TimeSplit,
            log_part: tuple[int, Path] | None = None) -> dict:
    """Stop samplers and the node watch, log the final metrics at the run's last step, flush, end the MLflow run.

    The time split ends as the final metrics go out (``close``: from the workload's last mark to
    here); the sink's last flush and the MLflow run's end come after it, outside ``time/total_s``.
    Each step is guarded: whatever fails here, the run still ends with its true status."""
    import ray

    from orchard.cluster.actors import kill_and_confirm
    from orchard.tracking import mlflow_run as tracking
    from orchard.tracking import system_metrics

    summary: dict = {}
    if live is not None:
        try:
            system_metrics.stop_samplers(live.samplers)
        except Exception as exc:
            say(f"orchard: resource samplers did not stop cleanly: {exc}", file=sys.stderr)
        # watched up to here, the last seconds before the final metrics; what the run saw goes
        # into its metrics (the caller's summary and outcome show it too)
        metrics.update(_nodes_seen(live.nodes, metrics))
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
        try:  # it restarts after a fault: one killed mid-restart could outlive a plain kill
            kill_and_confirm([live.sink])
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
            from orchard.models.logged import link_quality

            link_quality(tracked.client(), tracked.run_id)
        except Exception as exc:
            say(f"orchard: the model's metrics were not linked to it: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    if tracked:
        try:
            tracking.close_run(tracked, status, error)
        except Exception as exc:  # the reaper will close it ("driver lost") once this process is gone
            say(f"orchard: could not record the run's status {status}: {exc}", file=sys.stderr)
    return summary


def _nodes_seen(watch, metrics: dict) -> dict[str, float]:
    """The run's node watch stopped (LiveServices.nodes): the nodes lost and joined over the whole
    run, where it saw any; never fewer than the workload's own watch said (``metrics``)."""
    if watch is None:
        return {}
    try:
        watch.stop()
    except Exception:  # noqa: BLE001 - Ray going away: what it saw stands
        pass
    if not watch.nodes_lost and not watch.joined:
        return {}
    return {"cluster/nodes_lost": float(max(watch.nodes_lost, metrics.get("cluster/nodes_lost", 0))),
            "cluster/nodes_joined": float(max(watch.joined, metrics.get("cluster/nodes_joined", 0)))}


def _stopped_by_sweep(tracked) -> bool:
    from orchard.sweep.trials import STOPPED_TAG

    try:
        return STOPPED_TAG in tracked.client().get_run(tracked.run_id).data.tags
    except Exception:  # the store cannot answer: close it as usual
        return False


def _metric_count(tracked, metrics: dict) -> int:
    """As the MLflow UI counts them (the samplers' and workers' series too); the run's own final
    figures where the store cannot answer."""
    try:
        return len(tracked.client().get_run(tracked.run_id).data.metrics)
    except Exception:  # the store is gone at the end: count what this process holds
        return sum(isinstance(v, (int, float)) for v in metrics.values())


def print_summary(cfg: dict, module, name: str, tracked, status: str, run_dir: Path, metrics: dict,
                  error: BaseException | None = None) -> None:
    from orchard.tracking import summary

    label = f"{cfg['workload']['name']}/{cfg['strategy']['name']}"
    took = metrics.get("time/total_s")
    title = f"orchard {label}: {name}  {status}" + (f" in {took:,.1f} s" if isinstance(took, (int, float)) else "")
    footer = [f"run dir:   {run_dir}"]
    if tracked:
        n = _metric_count(tracked, metrics)
        footer.append(f"MLflow:    run {tracked.run_id} (experiment {tracked.experiment_id}), {n} metrics, the run's log and artifacts")
        figures = _figure_names(tracked)
        if figures:
            footer.append(f"figures:   {', '.join(figures)} (artifacts figures/)")
        if isinstance(error, Diverged):  # the same config would diverge again: not without a change
            footer.extend(_diverged_hint(cfg, module, tracked.run_id, error))
        elif isinstance(error, ConfigError):  # nor would the same value of a refused key
            footer.extend(_config_error_hint(cfg, module, tracked.run_id, run_dir, error))
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
        return [f"resume:    with a lower {error.key}: python -m orchard resume {resumable} {error.key}=..." + _resume_args(cfg, error.key)]
    return [f"again:     with a lower {error.key} (no checkpoint before it diverged): {_again(cfg, error.key)}"]


# a key the command line can change (not "run id", nor a resume's list of held-back keys)
_CONFIG_KEY = re.compile(r"^[A-Za-z_][\w.-]*$")


def _config_error_hint(cfg: dict, module, run_id: str, run_dir: Path, error: ConfigError) -> list[str]:
    """How to go on after a config value was refused mid-run (data read, actors placed): resume
    with another value where the run left something to resume from, as the workload's own
    ``resume`` judges it (forest and singa need a checkpoint: a run refused before its first round
    or epoch has none, and a resume of it would be refused in turn), else the same command again
    with another value. Never the unchanged command."""
    if not _CONFIG_KEY.match(error.key or ""):
        return []
    resumable = hasattr(module, "resume")
    if resumable:
        try:  # on a copy: the workload's resume writes its settings into the config it is given
            module.resume(copy.deepcopy(cfg), str(run_dir))
        except ConfigError as refused:
            resumable = refused.key == error.key  # only the value to be changed stands in its way
        except Exception:  # noqa: BLE001 - a hint, never a second error: offer the plain way
            resumable = False
    if resumable:
        return [f"resume:    with another {error.key}: python -m orchard resume {run_id} {error.key}=..."
                + _resume_args(cfg, error.key)]
    return [f"again:     with another {error.key}: {_again(cfg, error.key)}"]


def _again(cfg: dict, key: str) -> str:
    """The run's command line with ``key`` left for the user to give (secrets masked as recorded)."""
    from orchard.run import from_the_store

    typed = [o for o in redact.overrides(cfg.get("_overrides", [])) if from_the_store.key_of(o) != key]
    return f"python -m orchard {shlex.join(typed)} {key}=..."


def _figure_names(tracked) -> list[str]:
    """The run's figures (PNG artifacts under figures/), by name, for the summary."""
    try:
        found = tracked.client().list_artifacts(tracked.run_id, "figures")
    except Exception:  # an artifact store that cannot list: the UI still shows them
        return []
    return sorted(Path(a.path).stem for a in found if a.path.endswith(".png"))


def tracking_address(uri: str, run_id: str | None = None) -> str:
    """The tracking store as a user opens it: a server's URL as it is, a local store with the UI
    command that serves it (at the run's page)."""
    from orchard.tracking import store as tracking_store

    return uri if uri.startswith(("http://", "https://")) else f"{uri} (view: {tracking_store.ui_command_line(uri, run_id)})"


def _resume_args(cfg: dict, changing: str | None = None) -> str:
    """What ``python -m orchard resume <id>`` needs after the id: the store (unless the default),
    and what this run was given that a resume does not take back from the store (config folders,
    and overrides off ``from_the_store``'s allow-list), masked as recorded; never the recorded
    value of ``changing``, the key the line already asks a new value for."""
    from orchard.run import from_the_store
    from orchard.tracking.store import DEFAULT_URI

    uri = cfg["tracking"]["uri"]
    given = [] if uri == DEFAULT_URI else [f"tracking.uri={uri}"]
    changed = [f"{changing}=..."] if changing else []
    again = given + from_the_store.held_back(redact.overrides(cfg.get("_overrides", [])), given + changed)
    return "".join(f" {shlex.quote(o)}" for o in again) + "".join(
        f" --config-dir {shlex.quote(d)}" for d in registry.user_config_dirs())
