"""The sweep's leaderboard: trials ranked by the sweep metric (non-finite values last), the best
row, and the lines printed for failures and for a sweep without a best trial."""
from __future__ import annotations

import math

FINAL = "orchard/final"  # set only in a trial's last report: a trial without it was stopped early
STOPPED_EARLY = "stopped early by the {scheduler} scheduler (its {metric} lagged)"


def trial_error(trial) -> str:
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
        causes.setdefault(trial_error(trial), []).append(trial)
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
