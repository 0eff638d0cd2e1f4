"""Launch a per-worker training loop under Ray Train for the configured strategy.

Both ring and ps run under the same ``TorchTrainer``, so failure handling (``FailureConfig``:
a dead worker restarts the group, which resumes from the last checkpoint) and checkpoints are
the same for both.  ps additionally starts the parameter-server actors here, on the driver,
so they outlive a worker-group restart.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable


def _wrap(train_loop: Callable[[dict], None]) -> Callable[[dict], None]:
    def loop(config: dict) -> None:
        import ray.train

        from orchard.strategies import worker
        from orchard.tracking.gpu_peak import GpuPeak

        # where rank 0 notes each start of the group (worker.load_checkpoint; node_loss.py)
        worker._RECOVERY.update(log=config.get("recovery_log"), ctx=config["ctx"])
        config["ctx"].claim_gpus()  # the run's GPU figures cover exactly the workers' GPUs
        # what it holds on its GPU: a sweep whose trials share one sizes itself by it
        peak = GpuPeak(config["ctx"], ray.train.get_context().get_world_rank()).start()
        try:
            train_loop(config)
        finally:
            peak.stop()
            # Make sure every metric this worker logged reaches the store before it exits.
            config["ctx"].flush()

    loop.__name__ = getattr(train_loop, "__name__", "train_loop")
    return loop


def fit_off_main_thread(trainer):
    """``trainer.fit()`` from a helper thread while the main thread waits (orchard/background.py).

    Called from the main thread, Ray Train installs a SIGINT handler of its own that is never
    removed and answers Ctrl-C with ``SystemExit(0)``; from another thread it installs none
    (as inside Tune), so orchard's handler (``orchard/terminal/interrupts.py``) keeps the main thread:
    Ctrl-C or SIGTERM raise ``Interrupted`` here, and stopping Ray ends the Train run."""
    from orchard import background

    return background.call(trainer.fit, name="orchard-train-fit")


def abort_train_runs() -> int:
    """Abort the Ray Train runs this driver started that are still going; how many.

    For a run that is stopping (interrupted or failed): Ray Train's controller would otherwise
    train on, and the thread waiting in ``fit()`` with it, until the lifecycle's patience ran out.
    ``abort`` is what Ray Train's own Ctrl-C handler calls (it ends the worker group and the
    controller, and frees its placement group; checkpoints already in storage stay). Controllers
    run in this driver's job; found through the GCS actor table, as ``fit()`` keeps their handles
    to itself, so only a process that started a controller holds a handle to it (asking Ray for
    another's aborts the process): call it in the process that started the runs."""
    try:
        handles = _train_controllers()
        for handle in handles:
            handle.abort.remote()   # it exits: fit() raises in its thread, which then returns
        return len(handles)
    except Exception:  # noqa: BLE001 - a Ray Client driver, or Ray already gone: nothing to abort here
        return 0


def _train_controllers() -> list:
    """Handles of the Ray Train controllers this driver's job runs (the GCS actor table)."""
    from orchard.cluster import ray_private

    return ray_private.live_actor_handles("TrainController")


def free_orphaned_placement_groups() -> int:
    """Remove the placement groups whose creating actor has died; how many.

    Ray keeps a placement group until its creator *and* its job are gone. Ray Train's controller
    (an actor) creates its worker group's; when a sweep's scheduler stops a trial, Tune kills the
    trial's actor and the controller with it, and the group stays reserved for the whole sweep
    (the driver's job lives on), so the next trial's workers waited for CPUs nobody used. Ray
    Train's own ``PlacementGroupCleaner`` would remove it, but it asks the state API, which needs
    the dashboard that the embedded Ray runs without. The GCS table says who created each
    group and whether that actor is dead: a non-detached group whose creator actor died serves
    nobody. Groups the driver made (Tune's trial groups: no creator actor) are left alone."""
    import ray
    from ray.core.generated import gcs_pb2
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    from orchard.cluster import ray_private

    nil = ray.ActorID.nil().binary()
    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id()).binary()  # this driver's, not a neighbour's
    freed = 0
    for group in ray_private.placement_group_table():
        if (group.is_detached or group.creator_job_id != job or not group.creator_actor_dead
                or group.creator_actor_id in (b"", nil) or group.state == gcs_pb2.PlacementGroupTableData.REMOVED):
            continue
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))
            freed += 1
        except Exception:  # noqa: BLE001 - removed meanwhile
            pass
    return freed


class WorkersDidNotStart(RuntimeError):
    """Ray Train's worker group did not get its resources within the bound: what it asked for
    and what the cluster has, in one line."""

    def __init__(self, num_workers: int, per_worker: dict, nodes_lost: int = 0):
        from orchard.strategies.node_loss import did_not_start

        bound = float(os.environ.get("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60"))
        super().__init__(did_not_start(f"{num_workers} Ray Train workers", per_worker, bound, nodes_lost))


def _start_timed_out(exc: BaseException) -> bool:
    """``exc`` (or what it wraps) is Ray Train's worker-group start timeout."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in ("WorkerGroupStartupTimeoutError", "WorkerGroupStartupFailedError"):
            return True
        inner = getattr(exc, "controller_failure", None)
        exc = inner if inner is not None else (exc.__cause__ or exc.__context__)
    return False


def _storage_path(storage_path: str | None, cfg: dict, ctx) -> str:
    """Ray Train's storage: ``storage_path``, else the run's storage (``storage.uri``) + ``/train``."""
    from orchard.storage import Storage

    if storage_path:
        return Storage(storage_path).train_storage_path()
    run = ctx.storage or Storage(str(ctx.run_dir))  # no storage: a bare context (tests), the run folder
    return run.child("train").train_storage_path()


def launch(train_loop: Callable[[dict], None], loop_config: dict, cfg: dict, ctx, name: str,
           datasets: dict | None = None, storage_path: str | None = None, dataset_config=None):
    """Run ``train_loop(config)`` on ``cfg["strategy"]["num_workers"]`` Ray Train workers.

    ``config`` = ``loop_config`` + ``ctx``, ``strategy`` (and ``ps_group`` for ps).  Checkpoints
    go to ``storage_path`` (default: the run's storage + ``/train``, orchard/storage/) under ``name``; launching again with
    the same path and name resumes from the latest checkpoint.  Returns the Ray Train Result.
    """
    import ray.train
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    from orchard.cluster import ray_private
    from orchard.strategies import gpu_check, node_loss
    from orchard.strategies.process_group import ProcessGroupConfig

    strategy = cfg["strategy"]
    recovery = node_loss.RecoveryLog()
    config = {**loop_config, "ctx": ctx, "strategy": strategy, "recovery_log": recovery}
    group = None
    if strategy["name"] == "ps":
        from orchard.strategies.ps import PSGroup

        group = PSGroup.create(None, strategy["num_servers"], strategy["num_workers"], strategy["mode"],
                               loop_config.get("optimizer"), strategy.get("cpus_per_server", 0),
                               bool(strategy.get("async_average", False)))
        config["ps_group"] = group
    use_gpu = strategy.get("gpus_per_worker", 0) > 0
    resources = {"CPU": strategy.get("cpus_per_worker", 1)}
    if use_gpu:
        resources["GPU"] = strategy["gpus_per_worker"]
        # a torch without CUDA where the GPUs are: one line now, not a worker's failure and restarts
        gpu_check.check_gpus_usable(float(strategy["gpus_per_worker"]), cfg["cluster"].get("mode") == "local")
    backend = strategy.get("backend", "auto")
    if backend == "auto" and 0 < float(strategy.get("gpus_per_worker", 0) or 0) < 1:
        # workers sharing a GPU: NCCL refuses two ranks on one device ("Duplicate GPU detected")
        import warnings

        warnings.warn(f"strategy.gpus_per_worker={strategy['gpus_per_worker']}: workers share GPUs, so the "
                      "process group uses gloo (NCCL needs one GPU per worker)", stacklevel=2)
        backend = "gloo"
    # Ray's TorchConfig, from a module without torch: the controller need not import it (process_group.py)
    torch_config = ProcessGroupConfig(backend=None if backend == "auto" else backend,
                                      niceness=int(strategy.get("worker_niceness", 0) or 0))
    scaling = _scaling(strategy, use_gpu, resources)
    elastic = isinstance(scaling.num_workers, tuple)
    states = node_loss.controller_states(recovery) if elastic else None
    # an embedded Ray (cluster=local) has no autoscaler; a Ray without its dashboard (embedded or
    # attached) no state API
    cluster = cfg.get("cluster") or {}
    embedded = cluster.get("mode") == "local"
    state_api = bool(cluster.get("include_dashboard")) if embedded else ray_private.has_state_api()
    lean = ray_private.lean_trainer(TorchTrainer, embedded=embedded, state_api=state_api)
    trainer = lean(
        _wrap(train_loop),
        train_loop_config=config,
        torch_config=torch_config,
        scaling_config=scaling,
        run_config=RunConfig(
            name=name,
            # a folder or a URI (s3://...): every node opens it itself (orchard/storage/)
            storage_path=_storage_path(storage_path, cfg, ctx),
            callbacks=[states] if states is not None else None,
            # A worker that dies, or a node lost under one, restarts the group from the last
            # checkpoint (max_failures); the restarted group waits for its resources (a
            # replacement node) up to cluster.worker_start_timeout_s (the job's
            # RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, orchard/cluster/__init__.py), then the run ends in
            # one line: a group that cannot start is never retried (controller_failure_limit 0),
            # which Ray Train would otherwise do forever (-1), a hang
            failure_config=FailureConfig(max_failures=strategy.get("max_failures", 0), controller_failure_limit=0),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            # cluster.ray_log_level (orchard/cluster/__init__.py): Train's per-report INFO lines off the console
            logging_config=ray.train.LoggingConfig(log_level=os.environ.get("ORCHARD_RAY_LOG_LEVEL", "WARNING")),
        ),
        datasets=datasets,
        **({"dataset_config": dataset_config} if dataset_config is not None else {}),
    )
    watch = node_loss.NodeWatch(ctx, elastic=elastic)
    # an elastic group waits for its minimum without Ray's start bound: orchard keeps it
    bound = node_loss.StartBound(recovery, _start_bound_s()) if states is not None else None
    needed = min(scaling.num_workers) if elastic else scaling.num_workers
    try:
        try:
            with watch, (bound or contextlib.nullcontext()):
                result = fit_off_main_thread(trainer)
        except Exception as exc:
            if _start_timed_out(exc) or (bound is not None and bound.expired):
                raise WorkersDidNotStart(needed, resources, watch.nodes_lost) from exc
            raise
        if bound is not None and bound.expired:  # aborted: fit() may return rather than raise
            raise WorkersDidNotStart(needed, resources, watch.nodes_lost)
        return result
    finally:
        _log_recovery(ctx, watch, recovery)
        if group is not None:
            ctx.log_metrics({f"wire/ps_{k}": v for k, v in group.stats().items()})
            ctx.flush()
            group.shutdown()


def _scaling(strategy: dict, use_gpu: bool, resources: dict):
    """Ray Train's ScalingConfig: ``strategy.num_workers`` workers, or with
    ``strategy.min_workers`` below it an elastic group (Ray 2.60's ``num_workers=(min, max)``):
    it starts once ``min_workers`` fit, goes on with the workers left after a lost node instead
    of waiting for a replacement, and grows back when one joins, looking every
    ``strategy.resize_every_s`` s (each resize restarts the group from the last checkpoint)."""
    from ray.train import ScalingConfig

    most, least = int(strategy["num_workers"]), strategy.get("min_workers")
    if not least or int(least) >= most:
        return ScalingConfig(num_workers=most, use_gpu=use_gpu, resources_per_worker=resources)
    # SPREAD: Ray's PACK would put every worker that fits on one node, and losing that node
    # would take the whole group; spread, the group goes on with the workers on the nodes left
    return ScalingConfig(num_workers=(int(least), most), use_gpu=use_gpu, resources_per_worker=resources,
                         placement_strategy="SPREAD",
                         elastic_resize_monitor_interval_s=float(strategy.get("resize_every_s") or 60.0))


def _start_bound_s() -> float:
    """cluster.worker_start_timeout_s, as the job's environment carries it (orchard/cluster/__init__.py)."""
    return float(os.environ.get("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60"))


def _log_recovery(ctx, watch, recovery) -> None:
    """The run's node-loss figures (node_loss.train_metrics), then the log's records go."""
    from orchard.strategies import node_loss

    try:
        starts = recovery.read()
        ctx.log_metrics(node_loss.run_totals(ctx, node_loss.train_metrics(watch, starts)))
        ctx.flush()
        recovery.close()
    except Exception:  # noqa: BLE001 - Ray already stopping (an interrupt): nothing more to record
        pass
