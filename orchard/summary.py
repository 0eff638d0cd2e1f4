"""The end-of-run summary: the answer first, then speed, time and resources, then where to look.

Each workload declares its headline in the contract, ``headline(cfg, metrics) -> list[str]``
(flower: CNN MAE against the blob counter's; forest: pixel and mean per-class accuracy; video:
best fused top-1 against chance; singa: test accuracy against the app's target).  The full
table of metrics stays in MLflow, one command away.
"""
from __future__ import annotations

# The few run-level figures after the headline, in this order, when the run has them.
SPEED = "throughput/"
TIME = ("time/total_s", "time/train_s", "time/train_wall_s", "time/data_s", "time/prepare_s", "time/to_target_s")
RESOURCES = (("system/cpu_pct_mean", "CPU {:.0f}%"), ("system/mem_pct_mean", "memory {:.0f}%"),
             ("system/gpu_util_pct_mean", "GPU {:.0f}% busy"))


def num(value: float) -> str:
    """A figure as people read it: 4 significant digits, thousands separated."""
    return f"{value:,.4g}" if isinstance(value, (int, float)) else str(value)


def headline(module, cfg: dict, metrics: dict) -> list[str]:
    """The workload's headline lines, or its held-out results when it declares none."""
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
    used = [fmt.format(metrics[k]) for k, fmt in RESOURCES if isinstance(metrics.get(k), (int, float))]
    if used:
        out.append("resources: " + ", ".join(used) + " (means over the run)")
    out.extend(footer)
    return "\n".join(out)
