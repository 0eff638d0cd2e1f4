"""Ray Data's own per-operator figures for the pipeline, and its object-store budget.

``OperatorProbe`` is a Ray Data execution callback: whichever process runs a
dataset's streaming executor (the driver for validation and inference, a
split-coordinator actor for a stream's trainers), the probe samples every
operator there at most every ``SAMPLE_S`` seconds (internal input/output queues
in blocks and bytes, the operator's object-store usage, the executor's global
usage against its limit) and, when the execution ends, sends one summary per
execution to the master, which run.py and train.py turn into ``pipeline/<stage>_...``
metrics. The probe reads Ray Data internals (``OpRuntimeMetrics``, the
resource manager) through ``getattr`` with defaults: a renamed field reads 0,
it never breaks a run.

``pipeline_budget(mb)`` caps the object-store memory Ray Data may use for the
run's pipelines (``DataContext.execution_options.resource_limits``): with it
the operators back-pressure instead of filling the store, so a clip stream
many times larger than the budget streams in bounded memory.
"""
from __future__ import annotations

import contextlib
import time

from orchard.api import data_execution_callback_class

ExecutionCallback = data_execution_callback_class()  # Ray Data's only hook into a running dataset

PROBE_KEY = "orchard.video.operator_probe"  # DataContext config: {"master": actor name, "stages": [...]}
SAMPLE_S = 0.1


def _num(obj, name: str) -> float:
    value = getattr(obj, name, 0)
    return float(value() if callable(value) else (value or 0))


def _stage_names(ops, stages: list[str]) -> dict:
    """Operator -> stage name: ``decode`` and the features in pipeline order; the rest skipped."""
    features = iter(stages[1:])
    names = {}
    for op in ops:
        if "DecodeStage" in op.name:
            names[op] = "decode"
        elif "ExtractStage" in op.name:
            names[op] = next(features, "extract")
    return names


def _pool_size(a: dict, actors: float) -> None:
    """Track an actor pool's size: first, peak, the smallest after the peak (a scale-down), last.
    No running actor is a pool not started yet or torn down at the end (the autoscaler's minimum
    is at least 1): not a size."""
    if actors <= 0:
        return
    if a["actors_first"] < 0:
        a["actors_first"] = actors
    if actors > a["actors_peak"]:
        a["actors_peak"], a["actors_after_peak_min"] = actors, actors
    elif actors < a["actors_after_peak_min"]:
        a["actors_after_peak_min"] = actors
    a["actors_last"] = actors


class OperatorProbe(ExecutionCallback):
    """Samples operator queues during an execution; reports a summary to the master at its end."""

    def before_execution_starts(self, executor) -> None:
        spec = executor._data_context.get_config(PROBE_KEY)
        self._spec = spec
        self._names = _stage_names(list(executor._topology), spec["stages"]) if spec else {}
        self._acc = {name: {"samples": 0, "inqueue_blocks_sum": 0.0, "inqueue_blocks_peak": 0.0,
                            "outqueue_blocks_peak": 0.0, "queue_bytes_peak": 0.0, "store_bytes_peak": 0.0,
                            "actors_first": -1.0, "actors_peak": 0.0, "actors_after_peak_min": -1.0,
                            "actors_last": 0.0}
                     for name in self._names.values()}
        self._global_peak, self._last = 0.0, 0.0

    def on_execution_step(self, executor) -> None:
        if self._spec and time.perf_counter() - self._last >= SAMPLE_S:
            self._sample(executor)

    def _sample(self, executor) -> None:
        self._last = time.perf_counter()
        rm = executor._resource_manager
        with contextlib.suppress(Exception):
            self._global_peak = max(self._global_peak, rm.get_global_usage().object_store_memory)
        for op, name in self._names.items():
            m, a = op.metrics, self._acc[name]
            inq = _num(m, "obj_store_mem_internal_inqueue_blocks")
            a["samples"] += 1
            a["inqueue_blocks_sum"] += inq
            a["inqueue_blocks_peak"] = max(a["inqueue_blocks_peak"], inq)
            a["outqueue_blocks_peak"] = max(a["outqueue_blocks_peak"],
                                            _num(m, "obj_store_mem_internal_outqueue_blocks"))
            a["queue_bytes_peak"] = max(a["queue_bytes_peak"], _num(m, "obj_store_mem_internal_inqueue")
                                        + _num(m, "obj_store_mem_internal_outqueue"))
            with contextlib.suppress(Exception):
                a["store_bytes_peak"] = max(a["store_bytes_peak"], rm.get_op_usage(op).object_store_memory)
            pools = getattr(op, "get_autoscaling_actor_pools", lambda: [])()
            if pools:  # the stage's actor pool as Ray Data's autoscaler sizes it (scale up and down)
                _pool_size(a, float(sum(pool.num_running_actors() for pool in pools)))

    def after_execution_succeeds(self, executor) -> None:
        self._finish(executor)

    def after_execution_fails(self, executor, error: Exception) -> None:
        self._finish(executor)

    def _finish(self, executor) -> None:
        if not self._spec:
            return
        import ray

        self._sample(executor)
        ops = {}
        for op, name in self._names.items():
            m, a = op.metrics, self._acc[name]
            ops[name] = {**a, "backpressure_s": _num(m, "task_submission_backpressure_time")
                         + _num(m, "task_output_backpressure_time"),
                         "spilled_bytes": _num(m, "obj_store_mem_spilled"),
                         "bytes_out": _num(m, "bytes_outputs_taken")}
        limit = float("inf")
        with contextlib.suppress(Exception):
            # 0 until the resource manager's first update: an execution over before it (a few
            # cached segments) knows no limit, and must not read as a budget of 0 MiB
            limit = executor._resource_manager.get_global_limits().object_store_memory or float("inf")
        summary = {"ops": ops, "store_bytes_peak": self._global_peak, "store_limit_bytes": limit}
        with contextlib.suppress(Exception):  # a vanished master (run over) loses one summary, no more
            ray.get_actor(self._spec["master"]).operator_report.remote(summary)


def attach_probe(ds, master_name: str | None, stages: list[str]):
    """Make ``ds`` report its operators to the master named ``master_name`` (None: no probe)."""
    if master_name is None:
        return ds
    ctx = ds.context
    ctx.set_config(PROBE_KEY, {"master": master_name, "stages": list(stages)})
    if OperatorProbe not in ctx.custom_execution_callback_classes:
        ctx.custom_execution_callback_classes = [*ctx.custom_execution_callback_classes, OperatorProbe]
    return ds


def operator_metrics(summaries: list[dict], prefix: str = "pipeline") -> dict[str, float]:
    """MLflow metrics from the probe summaries of one window (e.g. an epoch's executions).

    Per stage: ``inqueue_blocks_mean`` / ``_peak`` (blocks waiting in the operator's
    internal input queue: a stage that cannot keep up), ``outqueue_blocks_peak``,
    ``queue_mb_peak``, ``store_mb_peak`` (object store held by the operator),
    ``backpressure_s`` (time Ray Data held the operator's tasks back), ``spilled_mb``;
    for an actor-pool stage ``pool_actors_peak`` (the most actors Ray Data's autoscaler ran) and
    ``pool_scale_downs`` (executions in which the pool shrank after its peak).
    Pipeline-wide: ``store_mb_peak`` and ``store_limit_mb`` (the budget it ran under).
    """
    out: dict[str, float] = {}
    per_stage: dict[str, list[dict]] = {}
    for s in summaries:
        for name, op in s["ops"].items():
            per_stage.setdefault(name, []).append(op)
    for name, ops in per_stage.items():
        p = f"{prefix}/{name}"
        samples = sum(o["samples"] for o in ops)
        out[f"{p}_inqueue_blocks_mean"] = sum(o["inqueue_blocks_sum"] for o in ops) / max(samples, 1)
        out[f"{p}_inqueue_blocks_peak"] = max(o["inqueue_blocks_peak"] for o in ops)
        out[f"{p}_outqueue_blocks_peak"] = max(o["outqueue_blocks_peak"] for o in ops)
        out[f"{p}_queue_mb_peak"] = max(o["queue_bytes_peak"] for o in ops) / 2**20
        out[f"{p}_store_mb_peak"] = max(o["store_bytes_peak"] for o in ops) / 2**20
        out[f"{p}_backpressure_s"] = sum(o["backpressure_s"] for o in ops)
        out[f"{p}_spilled_mb"] = sum(o["spilled_bytes"] for o in ops) / 2**20
        pooled = [o for o in ops if o.get("actors_first", -1) >= 0]
        if pooled:  # Ray Data's autoscaling of the stage's actor pool within its (min, max)
            out[f"{p}_pool_actors_peak"] = max(o["actors_peak"] for o in pooled)
            out[f"{p}_pool_scale_downs"] = float(sum(o["actors_after_peak_min"] < o["actors_peak"] for o in pooled))
    if summaries:
        out[f"{prefix}/store_mb_peak"] = max(s["store_bytes_peak"] for s in summaries) / 2**20
        limit = min(s["store_limit_bytes"] for s in summaries)
        if limit != float("inf"):
            out[f"{prefix}/store_limit_mb"] = limit / 2**20
    return out


@contextlib.contextmanager
def pipeline_budget(mb: float | None):
    """Cap Ray Data's object-store memory at ``mb`` MiB inside the block (None: Ray's default).

    Set on the current DataContext, which the run's datasets copy when they are
    created and which Ray Train reads for its ingest options; restored on exit
    so that other runs in the same process keep Ray's default.
    """
    from ray.data import DataContext

    if mb is None:
        yield
        return
    options = DataContext.get_current().execution_options
    before = options.resource_limits
    options.resource_limits = before.copy(object_store_memory=float(mb) * 2**20)
    try:
        yield
    finally:
        options.resource_limits = before


def operator_summaries(master, wait_s: float = 5.0) -> list[dict]:
    """The probe summaries the master holds (reset); waits briefly for the fire-and-forget report."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        got = ray.get(master.operator_summaries.remote(True))
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)
