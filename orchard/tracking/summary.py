"""The end-of-run summary: the answer first, then speed, time and resources, then where to look
(ending with the run's page in the MLflow UI).  And the same answer where the UI shows it: the
run's description (``mlflow.note.content``) and its ``headline/<name>`` metric.

Each workload declares its headline in the contract, ``headline(cfg, metrics) -> list[str]``
(flower: CNN MAE against the blob counter's; forest: pixel and mean per-class accuracy; video:
best fused top-1 against chance; singa: test accuracy against the app's target), and the one
figure behind it, ``headline_metric(metrics) -> (name, value)``, logged as ``headline/<name>``
so that a runs table across workloads or a sweep sorts by one column.  The full table of
metrics stays in MLflow, one command away.
"""
from __future__ import annotations

from orchard.tracking import time_split

# The few run-level figures after the headline, in this order, when the run has them.
SPEED = "throughput/"
TIME = ("time/total_s", "time/train_s", "time/train_wall_s", "time/data_s", "time/prepare_s", "time/to_target_s")
# The machine's CPU (every user's) beside the run's own processes', so a neighbour's load shows as such.
RESOURCES = (("system/cpu_pct_mean", "CPU {:.0f}% (machine)"), ("system/run_cpu_pct_mean", "this run {:.0f}%"),
             ("system/mem_pct_mean", "memory {:.0f}%"), ("system/gpu_util_pct_mean", "GPU {:.0f}% busy"))


def num(value: float) -> str:
    """A figure as people read it: 4 significant digits, thousands separated (12,345, not 1.234e+04)."""
    if not isinstance(value, (int, float)):
        return str(value)
    if abs(value) >= 1e4 and value == value and abs(value) != float("inf"):
        return f"{value:,.0f}"  # whole numbers past 4 digits: more digits, never an exponent
    return f"{value:,.4g}"


def predicted(metrics: dict) -> list[str]:
    """A ``mode=predict`` run's answer: what it predicted, how fast, what it skipped, and the
    workload's own figures of the batch (flowers counted, accuracy where inputs had labels)."""
    kinds = [k[len("predict/"):] for k in metrics
             if k.startswith("predict/") and f"{k}_per_s" in metrics and "/" not in k[len("predict/"):]]
    if not kinds:
        return []
    kind = kinds[0]
    # every file set aside or failed is in both counts (data/skipped_files has them by kind)
    skipped = max(metrics.get("predict/skipped", 0), metrics.get("data/skipped_files", 0))
    lines = [f"predicted: {num(metrics[f'predict/{kind}'])} {kind} ({num(metrics[f'predict/{kind}_per_s'])} {kind}/s), "
             f"{num(skipped)} skipped" + (" (skipped.csv says why)" if skipped else "")]
    extra = [f"{k[len('predict/'):]} {num(v)}" for k, v in sorted(metrics.items())
             if k.startswith("predict/") and k.count("/") == 1 and not k.endswith("_per_s")
             and k not in (f"predict/{kind}", "predict/skipped") and isinstance(v, (int, float))]
    return lines + ([", ".join(extra[:4])] if extra else [])


def headline(module, cfg: dict, metrics: dict) -> list[str]:
    """The workload's headline lines (for ``mode=predict``: what was predicted), or its held-out
    results when it declares none."""
    if cfg.get("mode") == "predict" and (lines := predicted(metrics)):
        return lines
    declared = getattr(module, "headline", None)
    if declared is not None:
        try:
            lines = [line for line in declared(cfg, metrics) if line]
        except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a failed run lacks its results
            lines = []
        if lines:
            return lines
    held_out = [k for k in sorted(metrics) if k.startswith(("test/", "val/")) and isinstance(metrics[k], (int, float))]
    return [f"{k} {num(metrics[k])}" for k in held_out[:4]]


# Overrides that say where a run is recorded or how it prints, not what it is: left out of its description.
NOT_DESCRIBING = ("workload", "strategy", "run_name", "tracking", "output_dir", "progress", "verbose", "hydra", "storage")
HEADLINE_PREFIX = "headline/"


def description(cfg: dict, trial: dict | None = None) -> str:
    """What a run is, in one line (the run's description in the MLflow UI): workload, strategy,
    the overrides that differ from the defaults (presets such as ``debug=smoke`` included) and,
    for a sweep's trial, the values it was given."""
    from orchard.config import redact

    typed = [o for o in redact.overrides(cfg.get("_overrides") or [])
             if o.split("=", 1)[0].lstrip("+~").split(".", 1)[0] not in NOT_DESCRIBING]
    parts = [f"**{cfg['workload']['name']}** {cfg['strategy']['name']}"]
    if typed:
        parts.append(" ".join(typed))
    if trial:
        parts.append("trial " + " ".join(f"{k}={v}" for k, v in sorted(trial.items())))
    return " · ".join(parts)


def trial_values(params: dict, parent_params: dict | None) -> dict:
    """The values a sweep's trial was given (flattened, as logged): the keys its parent's
    ``sweep.params`` search, and any other value in which it differs from its parent.  Empty for
    a run that is no trial."""
    if not parent_params:
        return {}
    swept = {k[len("sweep.params."):-len(".type")] for k in parent_params
             if k.startswith("sweep.params.") and k.endswith(".type")}
    return {k: v for k, v in params.items()
            if (k in swept or (k in parent_params and parent_params[k] != v)) and not k.startswith(("sweep.", "run_name"))}


def headline_metrics(module, metrics: dict) -> dict[str, float]:
    """``{"headline/<name>": value}`` from the workload's ``headline_metric(metrics)``; empty when
    it declares none or the run lacks the figure (a failed run)."""
    declared = getattr(module, "headline_metric", None)
    if declared is None:
        return {}
    try:
        name, value = declared(metrics)
    except (KeyError, TypeError, ValueError):
        return {}
    return {f"{HEADLINE_PREFIX}{name}": float(value)}


def note_result(client, run_id: str, module, cfg: dict, metrics: dict) -> None:
    """Append the headline result to the run's description (set when the run opened); the run's
    logged model gets the same description (its page in the UI says what it is and how it did)."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    from orchard.tracking.store import retried

    lines = headline(module, cfg, metrics)
    if not lines:
        return
    run = retried(client.get_run, run_id)
    note = f"{run.data.tags.get(MLFLOW_RUN_NOTE) or description(cfg)} → {lines[0]}"
    retried(client.set_tag, run_id, MLFLOW_RUN_NOTE, note)
    for output in (run.outputs.model_outputs if run.outputs else []):
        retried(client.set_logged_model_tags, output.model_id, {MLFLOW_RUN_NOTE: note})


def view_lines(tracking_uri: str, experiment_id: str, run_id: str) -> list[str]:
    """The summary's last lines: how to open the UI on the store, and the run's page in it, a
    store's password masked (orchard/config/redact.py)."""
    from orchard.config import redact
    from orchard.tracking import store as tracking_store

    url = tracking_store.run_url(tracking_uri, experiment_id, run_id)
    if tracking_uri.startswith(("http://", "https://")):
        lines = [f"view:      {url}", f"server:    {tracking_uri} (tracking server)"]
    else:
        lines = [f"view:      {tracking_store.ui_command_line(tracking_uri, run_id)}", f"           (opens {url})"]
    return [redact.text(line) for line in lines]


def render(title: str, lines: list[str], metrics: dict, footer: list[str]) -> str:
    """The summary as printed: title, headline, speed, time, resources, footer."""
    out = [title, *(f"  {line}" for line in lines)]
    speed = [k for k in sorted(metrics) if k.startswith(SPEED) and isinstance(metrics[k], (int, float))
             and not k[len(SPEED):].startswith(("std_", "var_"))][:4]
    if speed:
        out.append("speed:     " + ", ".join(f"{k[len(SPEED):]} {num(metrics[k])}" for k in speed))
    times = [k for k in TIME if isinstance(metrics.get(k), (int, float))][:4]
    if times:
        out.append("time:      " + ", ".join(f"{k[5:-2]} {metrics[k]:,.1f} s" for k in times))
    parts = time_split.line(metrics)
    if parts:  # where every second went (orchard/tracking/time_split.py)
        out.append("split:     " + parts)
    used = [fmt.format(metrics[k]) for k, fmt in RESOURCES if isinstance(metrics.get(k), (int, float))]
    if used:
        out.append("resources: " + ", ".join(used) + " (means over the run)")
    out.extend(footer)
    return "\n".join(out)
