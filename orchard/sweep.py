"""Ray Tune sweeps: ``python -m orchard workload=<name> sweep=<name>``.

``conf/sweep/<name>.yaml`` declares the search (param space over any config keys, metric,
mode, samples, scheduler, concurrency).  The sweep is a parent MLflow run; every trial is a
child run (``mlflow.parentRunId``) produced by the same ``run_one`` as a single run.  The
parent records the best trial's config and metric and the leaderboard.  Tune's experiment
state lives in ``<output_dir>/sweeps/<workload>-<sweep>``: running the same command again after
a crash or Ctrl-C resumes the unfinished trials instead of starting over.
"""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchard import config as config_lib
from orchard.errors import ConfigError

if TYPE_CHECKING:
    from orchard.cli import Outcome

PARAM_TYPES = ("grid", "choice", "uniform", "loguniform", "randint")


def validate_sweep(cfg: dict) -> None:
    s = cfg["sweep"]
    config_lib.require(cfg, "sweep.metric", lambda v: isinstance(v, str) and "/" in v, "a metric key such as val/mae")
    config_lib.require_choice(cfg, "sweep.mode", ("min", "max"))
    config_lib.require_positive(cfg, "sweep.num_samples", integer=True)
    config_lib.require_positive(cfg, "sweep.max_concurrent_trials", integer=True)
    config_lib.require_choice(cfg, "sweep.scheduler", ("fifo", "asha"))
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


def trial_config(base: dict, values: dict) -> dict:
    cfg = copy.deepcopy(base)
    for key, value in values.items():
        config_lib.set_key(cfg, key, value)
    return cfg


def _make_trainable(base: dict, module_name: str, parent_run_id: str | None, metric: str):
    def trainable(values: dict) -> None:
        import importlib

        from ray import tune

        from orchard.cli import run_one

        cfg = trial_config(base, values)
        trial = tune.get_context().get_trial_name()
        cfg["run_name"] = f"{base['_sweep_name']}-{trial}"
        cfg["sweep"] = None
        reported = {"n": 0}

        def report(metrics: dict, step) -> None:
            # Intermediate values of the sweep metric feed the scheduler (ASHA) as they come.
            if metric in metrics:
                reported["n"] += 1
                reported["last"] = metrics[metric]
                tune.report({metric: metrics[metric], "step": reported["n"]})

        outcome = run_one(cfg, importlib.import_module(module_name), parent_run_id=parent_run_id, on_metrics=report, quiet=True)
        if outcome.exit_code != 0:
            raise RuntimeError(f"trial {trial} failed: {outcome.error}")
        final = {k: v for k, v in outcome.metrics.items() if isinstance(v, (int, float))}
        if metric not in final and "last" in reported:
            final[metric] = reported["last"]  # a per-step metric: its last value ranks the trial
        tune.report({**final, "run_id": outcome.run_id or "", "step": reported["n"] + 1})

    return trainable


def sweep_dir(cfg: dict) -> Path:
    return Path(cfg["output_dir"]).resolve() / "sweeps" / f"{cfg['workload']['name']}-{cfg['sweep']['name']}"


def run_sweep(cfg: dict, module) -> Outcome:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from orchard import tracking
    from orchard.cli import Outcome

    s = cfg["sweep"]
    folder = sweep_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    state_file = folder / "orchard_sweep.json"
    exp_path = folder / "tune"
    resuming = tune.Tuner.can_restore(str(exp_path))
    base = copy.deepcopy(cfg)
    base["_sweep_name"] = s["name"]
    tracked = None
    client = None
    if cfg["tracking"]["enabled"]:
        if resuming and state_file.exists():
            parent_id = json.loads(state_file.read_text())["parent_run_id"]
            tracked = tracking.TrackedRun(parent_id, "", tracking.resolve_uri(cfg["tracking"]["uri"]))
            client = tracked.client()
            client.update_run(parent_id, status="RUNNING")
            _kill_stale_children(client, parent_id)
        else:
            sweep_cfg = copy.deepcopy(cfg)
            tracked = tracking.open_run(sweep_cfg, cfg.get("run_name") or f"sweep-{s['name']}-{time.strftime('%y%m%d-%H%M%S')}",
                                        extra_tags={"orchard.sweep": s["name"]})
            client = tracked.client()
            state_file.write_text(json.dumps({"parent_run_id": tracked.run_id}))
    parent_id = tracked.run_id if tracked else None
    metric, mode = s["metric"], s["mode"]
    trainable = tune.with_resources(_make_trainable(base, module.__name__, parent_id, metric),
                                    dict(s.get("resources_per_trial") or {"cpu": 1}))
    if s["scheduler"] == "asha":
        a = s.get("asha") or {}
        scheduler = ASHAScheduler(time_attr="step", max_t=int(a.get("max_t", 100)), grace_period=int(a.get("grace_period", 1)),
                                  reduction_factor=float(a.get("reduction_factor", 2)))
    else:
        scheduler = FIFOScheduler()
    run_config = tune.RunConfig(name="tune", storage_path=str(folder), verbose=0)
    print(f"orchard: sweep {s['name']} {'resuming' if resuming else 'starting'} in {folder}", flush=True)
    if resuming:
        tuner = tune.Tuner.restore(str(exp_path), trainable=trainable, resume_errored=True, restart_errored=False)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(s["params"]),
            tune_config=tune.TuneConfig(metric=metric, mode=mode, num_samples=s["num_samples"],
                                        max_concurrent_trials=s["max_concurrent_trials"], scheduler=scheduler),
            run_config=run_config,
        )
    status = "FINISHED"
    try:
        grid = tuner.fit()
    except KeyboardInterrupt:
        status = "KILLED"
        if tracked:
            tracking.close_run(tracked, status, None)
        print("orchard: sweep interrupted; run the same command again to resume", file=sys.stderr)
        return Outcome(130, parent_id, {}, "KeyboardInterrupt")
    rows = leaderboard(grid, list(s["params"]), metric, mode)
    best = rows[0] if rows else None
    if tracked:
        if best:
            client.log_batch(parent_id, metrics=[], params=[])
            for key, value in best["params"].items():
                client.set_tag(parent_id, f"best.{key}", str(value))
            client.log_metric(parent_id, f"best/{metric}", best["metric"])
            client.set_tag(parent_id, "best_run_id", best["run_id"])
        tracking_dir = folder / "leaderboard.json"
        tracking_dir.write_text(json.dumps(rows, indent=2))
        client.log_artifact(parent_id, str(tracking_dir))
        errors = [r for r in grid if r.error]
        tracking.close_run(tracked, "FAILED" if len(errors) == len(grid) and len(grid) else "FINISHED",
                           errors[0].error if errors and len(errors) == len(grid) else None)
    print(format_leaderboard(rows, metric, parent_id))
    if not rows:
        return Outcome(1, parent_id, {}, "no trial finished")
    return Outcome(0, parent_id, {f"best/{metric}": best["metric"]}, None)


def _kill_stale_children(client, parent_id: str) -> None:
    """Trials that were running when the sweep died will run again; close their old runs."""
    exp_id = client.get_run(parent_id).info.experiment_id
    for run in client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'RUNNING'"):
        client.set_terminated(run.info.run_id, status="KILLED")


def leaderboard(grid, keys: list[str], metric: str, mode: str) -> list[dict]:
    rows = []
    for result in grid:
        m = result.metrics or {}
        if result.error or metric not in m:
            continue
        rows.append({"trial": result.path.rsplit("/", 1)[-1][:40] if result.path else "?",
                     "params": {k: result.config.get(k) for k in keys},
                     "metric": float(m[metric]), "run_id": m.get("run_id", "")})
    rows.sort(key=lambda r: r["metric"], reverse=(mode == "max"))
    return rows


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
