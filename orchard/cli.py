"""``python -m orchard workload=<name> [strategy=<name>] [key=value ...]``

Compose and validate the config (before Ray starts), start or attach to Ray, open the MLflow
run, hand it to the workload, show progress, and end with a summary.  Exit codes: 0 success,
1 the workload failed (run marked FAILED), 2 bad config (nothing started), 130 interrupted
(run marked KILLED).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchard import config as config_lib
from orchard import registry
from orchard.errors import ConfigError

USAGE = """usage: python -m orchard workload=<name> [strategy=<name>] [group=option ...] [key=value ...]
       python -m orchard workload=<name> sweep=<name>          Ray Tune search, one MLflow run per trial
       python -m orchard --multirun workload=<name> key=a,b     Hydra multirun over a plain grid
       python -m orchard workload=<name> --cfg                  print the composed config and exit

config groups (conf/<group>/<option>.yaml):
{groups}
examples:
  python -m orchard workload=flower strategy=ring
  python -m orchard workload=flower strategy=ps strategy.mode=async strategy.num_servers=2
  python -m orchard workload=forest debug=smoke tracking=none
"""


@dataclass
class Outcome:
    exit_code: int
    run_id: str | None = None
    metrics: dict = field(default_factory=dict)
    error: str | None = None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        groups = "\n".join(f"  {g:<11} {', '.join(config_lib.group_options(g)) or '-'}" for g in config_lib.GROUPS)
        print(USAGE.format(groups=groups))
        sys.exit(0)
    if any(a in ("-m", "--multirun") for a in argv):
        from orchard.multirun import run_multirun

        sys.exit(run_multirun([a for a in argv if a not in ("-m", "--multirun")]))
    print_cfg = "--cfg" in argv
    overrides = [a for a in argv if a != "--cfg"]
    try:
        cfg, module = prepare(overrides)
    except ConfigError as err:
        print(f"orchard: bad config: {err}", file=sys.stderr)
        sys.exit(2)
    if print_cfg:
        import yaml

        print(yaml.safe_dump({k: v for k, v in cfg.items() if not k.startswith("_")}, sort_keys=False))
        sys.exit(0)
    outcome = execute(cfg, module)
    sys.exit(outcome.exit_code)


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


def default_run_name(cfg: dict) -> str:
    return cfg.get("run_name") or f"{cfg['workload']['name']}-{cfg['strategy']['name']}-{time.strftime('%y%m%d-%H%M%S')}"


def execute(cfg: dict, module=None) -> Outcome:
    """Run a validated config end to end (or its sweep) and return the outcome."""
    from orchard import cluster

    module = module or registry.load(cfg["workload"]["name"])
    started_ray = cluster.connect(cfg["cluster"])
    try:
        if cfg.get("sweep"):
            from orchard.sweep import run_sweep

            return run_sweep(cfg, module)
        return run_one(cfg, module)
    finally:
        if started_ray:
            cluster.shutdown()


def run_one(cfg: dict, module, parent_run_id: str | None = None, on_metrics=None, quiet: bool = False) -> Outcome:
    """One tracked run of ``module.run(cfg, ctx)`` on a running Ray session."""
    import ray

    from orchard import resources, tracking
    from orchard.context import RunContext
    from orchard.metrics_sink import MetricsSink
    from orchard.progress import ProgressLine, summary_table

    t_start = time.time()
    name = default_run_name(cfg)
    tcfg = cfg["tracking"]
    tracked = tracking.open_run(cfg, name, parent_run_id) if tcfg["enabled"] else None
    run_id = tracked.run_id if tracked else None
    run_dir = Path(cfg["output_dir"]).resolve() / cfg["workload"]["name"] / (run_id or name)
    run_dir.mkdir(parents=True, exist_ok=True)
    # The sink lives on the driver's node: a sqlite store is a file only this machine sees.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    sink = MetricsSink.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(
        tracked.tracking_uri if tracked else None, run_id, tcfg.get("flush_interval_s", 1.0))
    ctx = RunContext(sink, run_id, str(run_dir), cfg["workload"]["name"], cfg["strategy"]["name"],
                     tracked.tracking_uri if tracked else None)
    ctx._on_metrics = on_metrics
    if tracked:
        ctx.set_tags({"orchard.run_dir": str(run_dir)})
    samplers = resources.start_samplers(ctx, tcfg["sample_interval_s"]) if tcfg.get("system_metrics") else []
    status, error, metrics, exit_code = "FINISHED", None, {}, 0
    plain = {k: v for k, v in cfg.items() if not k.startswith("_")}
    label = f"{cfg['workload']['name']}/{cfg['strategy']['name']}"
    try:
        with ProgressLine(sink, label, "never" if quiet else cfg.get("progress", "auto")):
            metrics = dict(module.run(plain, ctx) or {})
    except KeyboardInterrupt as exc:
        status, error, exit_code = "KILLED", exc, 130
    except Exception as exc:  # the run is marked FAILED with the reason; the CLI exits 1
        status, error, exit_code = "FAILED", exc, 1
    finally:
        try:
            resources.stop_samplers(samplers)
        except Exception as exc:
            print(f"orchard: resource samplers did not stop cleanly: {exc}", file=sys.stderr)
    summary = {}
    try:
        series = ray.get(sink.series.remote(""))
        summary = resources.summarize({k: v for k, v in series.items() if k.startswith(("system/", "gpu/"))})
        final = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        ctx.log_metrics({**summary, **final, "time/total_s": time.time() - t_start})
        ray.get(sink.close.remote())
    finally:
        if tracked:
            tracking.close_run(tracked, status, error)
        ray.kill(sink)
    metrics = {**summary, **metrics, "time/total_s": time.time() - t_start}
    if error is not None and not isinstance(error, KeyboardInterrupt):
        print(f"orchard: {cfg['workload']['name']} failed: {type(error).__name__}: {error}", file=sys.stderr)
        if tracked:
            print(f"orchard: run {run_id} marked FAILED; traceback in its artifact error.txt", file=sys.stderr)
    if not quiet:
        footer = [f"status: {status}    run dir: {run_dir}"]
        if tracked:
            footer.append(f"MLflow run: {run_id} (experiment {tracked.experiment_id})")
            footer.append(f"view: {tracking.ui_command(tracked.tracking_uri)}")
        print(summary_table(f"orchard {label}: {name}", {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, footer))
    return Outcome(exit_code, run_id, metrics, None if error is None else f"{type(error).__name__}: {error}")
