"""What runs beside a run while it trains, started once its MLflow run is open: the metrics sink
(one actor on the driver's node writes every worker's metrics), the run's context that workers
log through, the resource samplers and, on an attached cluster, the run's node watch;
``LiveServices`` holds them so the run's end (ending.py) stops each one, whatever way the run ended."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchard.config import redact
from orchard.tracking.time_split import TimeSplit


@dataclass
class LiveServices:
    """What a run has started besides the MLflow run: closed in reverse by ``end_run``."""
    ctx: object
    sink: object
    samplers: list
    nodes: object = None   # NodeWatch over the whole run on an attached cluster (end_run reads it)


def start_run_services(cfg: dict, tracked, run_id: str | None, run_dir: Path, on_metrics,
                       split: TimeSplit, side=None) -> LiveServices:
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
        uri, run_id, tcfg.get("flush_interval_s", 1.0), max_series=tcfg.get("max_series_points", 10_000),
        watch=tuple((cfg.get("_trial") or {}).get("watch", ())))  # a sweep trial's metric (sweep/trials.py)
    from orchard.storage import Storage

    ctx = RunContext(sink, run_id, str(run_dir), cfg["workload"]["name"], cfg["strategy"]["name"], uri,
                     storage=Storage.for_run(cfg, run_dir), previous_storage=Storage.previous_run(cfg))
    ctx._on_metrics = on_metrics
    ctx.time_split = split
    ctx.side = side
    live = LiveServices(ctx, sink, [])
    if tcfg.get("system_metrics"):
        live.samplers = system_metrics.start_samplers(ctx, tcfg["sample_interval_s"])
    if cfg["cluster"]["mode"] == "remote":
        # a node lost at any moment of the run counts, not only while a workload's own watch
        # looks (it spans the training: forest's rounds, a Train group's fit): one lost as a
        # run's model was being logged went unrecorded
        from orchard.strategies.node_loss import NodeWatch

        live.nodes = NodeWatch(ctx).start()
    return live
