"""Every private Ray API orchard uses, in one place, each with why no public one serves.

Ray (pinned in pyproject to the 2.60 series) may move any of these in a release; the test
``tests/orchard/cluster/test_ray_private.py`` touches each of them, so an upgrade that moves one fails
CI by name instead of breaking a run at its first interrupt or sweep. Nothing else in orchard
imports ``ray._private`` or reads private attributes of Ray objects.
"""
from __future__ import annotations

import contextlib
import json
import sys

# Ray's own logger for the token-auth notice (ray_logging quiets its one warning, keeps auth on).
TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"


def set_auto_connect(enabled: bool) -> None:
    """``ray.shutdown()`` turns auto-connect off for the process; a driver that starts Ray again
    (a multirun's next job) turns it back on. No public switch exists."""
    from ray._private import auto_init_hook

    auto_init_hook.enable_auto_connect = enabled


def node_ip_address() -> str:
    """This node's address as Ray itself picks it (what peers reach, never 127.0.0.1 by default);
    the public ``ray.util.get_node_ip_address`` needs a connected Ray, and orchard needs the
    address before starting one (to pin the GCS port)."""
    from ray._private import services

    return services.get_node_ip_address()


@contextlib.contextmanager
def ray_children_in_their_own_group():
    """Ray's GCS, raylet and workers started in their own process group, so that a Ctrl-C to the
    terminal's group reaches the driver alone (it then closes the run and stops Ray). Ray starts
    its processes through ``services.ConsolePopen`` and offers no option for this; they keep
    the kernel's parent-death signal, so nothing outlives the driver."""
    from ray._private import services, utils

    if not sys.platform.startswith("linux") or not utils.detect_fate_sharing_support():
        yield
        return
    popen = services.ConsolePopen

    class OwnGroupPopen(popen):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnGroupPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


def live_actor_handles(class_suffix: str) -> list:
    """Handles to this job's live actors whose class name ends with ``class_suffix`` (Ray Train's
    ``TrainController``: ``fit()`` keeps its handle to itself, and the public state API needs the
    dashboard, which the embedded Ray runs without)."""
    import ray
    from ray._private import state

    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    alive = state.actors(job_id=job, actor_state_name="ALIVE")
    core = ray._private.worker.global_worker.core_worker
    return [core.get_actor_handle(ray.ActorID.from_hex(actor_id)) for actor_id, info in alive.items()
            if info.get("ActorClassName", "").endswith(class_suffix)]


def placement_group_table() -> list:
    """Every placement group of the cluster as the GCS keeps it (``PlacementGroupTableData``):
    creator actor, creator job, whether the creator died. ``ray.util.placement_group_table``
    leaves out the creator fields orchard needs to free a dead actor's group."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    return [gcs_pb2.PlacementGroupTableData.FromString(raw)
            for raw in state.state._connect_and_get_accessor().get_placement_group_table()]


# Loggers of Ray's internals whose INFO records are chatter for an orchard user (ray_logging.py
# quiets them); the test imports each, so a renamed module shows.
TRAIN_CHATTY_LOGGERS = ("ray.train.v2._internal.execution.context",
                        "ray.train.v2._internal.execution.worker_group.worker_group",
                        "ray.train.v2._internal.execution.controller.controller")
TRAIN_PG_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def data_execution_callback_class():
    """Ray Data's ``ExecutionCallback`` (the video workload's per-operator probe subclasses it):
    the only hook into a running dataset's operators; Ray Data has no public one."""
    from ray.data._internal.execution.execution_callback import ExecutionCallback

    return ExecutionCallback


def reconfigure_data_logging() -> None:
    """Apply ``RAY_DATA_LOGGING_CONFIG`` after ray.data was imported (it reads it once, at import)."""
    from ray.data._internal.logging import configure_logging

    configure_logging()


def lean_trainer(trainer_class, embedded: bool = False, state_api: bool = True):
    """``trainer_class`` (a Ray Train V2 trainer) whose runs start only the actors they use. Each
    left-out part is an actor process more (its Python and Ray imports: a second or more of a
    2-core machine's CPU) at every start and restart of every flower and video group, and no
    public switch leaves it out:

    - Train's ``DatasetsCallback`` starts a ``DatasetManager`` (it imports Ray Data to serve
      shards) for every run: left out for a run given no Ray Datasets.
    - ``embedded`` (a Ray this driver started: one machine, no autoscaler): a fixed-size group's
      controller asks Ray's autoscaling coordinator for its workers' resources before it starts
      them, a blocking call to an actor started for it (1.5 s of a flower smoke run's group
      start on 2 cores, and again at the end to cancel), read only by an autoscaler an embedded
      Ray does not have. Elastic groups keep it: the coordinator sizes them.
    - ``state_api`` False (an embedded Ray without its dashboard): Train's detached
      ``PlacementGroupCleaner`` watches the controller through the state API, which answers
      "unavailable" there, so it could never clean anything; orchard frees the placement groups
      of dead controllers itself (``launch.free_orphaned_placement_groups``).

    And one change that is a fix, not a saving: an elastic group (``ElasticScalingPolicy``) sizes
    its restart from the coordinator's view of the nodes, which the policy caches for 1 s
    (``GET_RESERVED_RESOURCES_INTERVAL_S``). After a lost node the controller goes from its last
    running decision to the restart's within that second when it polls its workers more often
    than every 2 s, and sized the new group from the cached view that still held the lost node:
    two workers where one fits, its placement group waiting for a CPU that was gone (the video
    node-loss test hung so at a 0.2 s poll; node_loss._refresh_node_view makes the coordinator
    look again, but the cache answered before it was asked). The first decision after the group
    stopped running now asks the coordinator."""
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    class FixedWithoutAutoscaler(FixedScalingPolicy):
        """A fixed group's policy that sends the autoscaling coordinator nothing (and so never
        starts it); its decisions are FixedScalingPolicy's."""

        def after_controller_start(self, train_run_context):
            pass

        def _maybe_send_resource_request(self):
            pass

        def _send_resource_request(self):
            pass

    class ElasticFreshAfterRestart(ElasticScalingPolicy):
        """ElasticScalingPolicy whose first decision for a stopped group reads the nodes anew."""

        _was_running = False

        def make_decision_for_running_worker_group(self, *args, **kwargs):
            self._was_running = True
            return super().make_decision_for_running_worker_group(*args, **kwargs)

        def make_decision_for_non_running_worker_group(self):
            if self._was_running:  # the group just stopped: the cached view may hold a lost node
                self._was_running = False
                self._latest_reserved_resources_query_time = float("-inf")
            return super().make_decision_for_non_running_worker_group()

    class Trainer(trainer_class):
        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            unused = ((() if self.datasets else (DatasetsCallback,))
                      + (() if state_api else (PlacementGroupCleanerCallback,)))
            return [cb for cb in callbacks if not isinstance(cb, unused)]

        def _initialize_and_run_controller(self, **kwargs):
            policy = kwargs.get("scaling_policy")
            if embedded and type(policy) is FixedScalingPolicy:
                kwargs["scaling_policy"] = FixedWithoutAutoscaler(scaling_config=policy.scaling_config)
            elif type(policy) is ElasticScalingPolicy:
                kwargs["scaling_policy"] = ElasticFreshAfterRestart(scaling_config=policy.scaling_config)
            return super()._initialize_and_run_controller(**kwargs)

    Trainer.__name__ = Trainer.__qualname__ = trainer_class.__name__
    return Trainer


def has_state_api() -> bool:
    """Whether the Ray this driver is connected to serves its state API (``ray.util.state``): its
    dashboard registered an API server address in the GCS. An embedded Ray without its dashboard
    registers port 0 (``without_api_server``), and so may a cluster started without one; there
    Ray Train's ``PlacementGroupCleaner`` can never see the controller (every poll answers
    "unavailable") and, after a driver killed outright, polls so for the cluster's lifetime."""
    import ray.experimental.internal_kv as internal_kv
    from ray._private import ray_constants

    try:
        address = internal_kv._internal_kv_get(ray_constants.DASHBOARD_ADDRESS,
                                               namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
    except Exception:  # a Ray Client driver reads no GCS keys: keep Ray Train's default
        return True
    return bool(address) and not address.decode().endswith(":0")


# ---- node loss (orchard/strategies/node_loss.py) -------------------------------------------
def actor_handle(actor_id: str):
    """A handle to the actor with this hex id: Ray Train's controller, to end it when an elastic
    group never started (its handle stays inside ``fit()``)."""
    import ray

    return ray._private.worker.global_worker.core_worker.get_actor_handle(ray.ActorID.from_hex(actor_id))


class ClusterNotes:
    """Small records in the GCS's key-value store (``ray.experimental.internal_kv``, which Ray's
    own libraries use for theirs): any process of the cluster writes and reads them with no
    actor, so no process of its own to start. The public alternative, an actor, costs a Ray
    worker process (~1.2 s of CPU to start) for a few hundred bytes. Values are JSON; every key
    lives under ``prefix`` in orchard's namespace, and ``clear`` drops them all."""

    NAMESPACE = "orchard"

    def __init__(self, prefix: str):
        self.prefix = prefix

    @staticmethod
    def _kv():
        import ray.experimental.internal_kv as internal_kv

        return internal_kv

    def put(self, name: str, value, overwrite: bool = True) -> bool:
        """Store ``value`` under ``name``; True when the name was taken already (then, with
        ``overwrite=False``, nothing is written)."""
        return self._kv()._internal_kv_put(self.prefix + name, json.dumps(value), overwrite, namespace=self.NAMESPACE)

    def get(self, name: str):
        raw = self._kv()._internal_kv_get(self.prefix + name, namespace=self.NAMESPACE)
        return None if raw is None else json.loads(raw)

    def names(self, under: str = "") -> list[str]:
        """The names stored under ``under``, sorted."""
        keys = self._kv()._internal_kv_list(self.prefix + under, namespace=self.NAMESPACE)
        return sorted(k.decode()[len(self.prefix):] for k in keys)

    def clear(self) -> None:
        self._kv()._internal_kv_del(self.prefix, del_by_prefix=True, namespace=self.NAMESPACE)


def train_controller_callback_class():
    """Ray Train's ``ControllerCallback``: the only hook on the controller's state changes
    (``after_controller_state_update``); no public callback sees them."""
    from ray.train.v2._internal.execution.callback import ControllerCallback

    return ControllerCallback


def refresh_autoscaling_coordinator() -> None:
    """Make Ray's autoscaling coordinator (which sizes elastic Train groups) read the node table
    now rather than at its next 20 s tick: no public call does."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    get_or_create_autoscaling_coordinator().get_reserved_resources.remote("orchard-node-view", recompute=True)


def answers_without_token(gcs_address: str, timeout_s: float = 5.0) -> bool:
    """True if the Ray cluster at ``gcs_address`` (host:port of its GCS) serves a request that
    carries no auth token: a cluster started without token auth, which runs the code of anyone
    who reaches its ports. A cluster with auth answers UNAUTHENTICATED. No public API tells a
    client the server's auth mode (the client's own ``RAY_AUTH_MODE`` says only what it sends),
    so this asks the GCS's cheapest RPC, ``GetClusterId``, over a channel without the token."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return False
            raise
    return True


def detected_resources() -> dict[str, float]:
    """The CPUs and GPUs an embedded ``ray.init()`` would give this machine (cgroup limits and
    CPU affinity counted, ``CUDA_VISIBLE_DEVICES`` honoured), before starting it: a run whose
    workers cannot fit is refused in a second, not after a Ray start. Ray offers no public way
    to ask without starting."""
    from ray._private.accelerators import get_accelerator_manager_for_resource
    from ray._private.utils import get_num_cpus

    manager = get_accelerator_manager_for_resource("GPU")
    gpus = manager.get_current_node_num_accelerators() if manager else 0
    visible = manager.get_current_process_visible_accelerator_ids() if manager else None
    if visible is not None:  # as Ray counts them: no more than CUDA_VISIBLE_DEVICES shows
        gpus = min(gpus, len(visible))
    return {"CPU": float(get_num_cpus()), "GPU": float(gpus)}


@contextlib.contextmanager
def driver_keeps_its_sigterm_handler():
    """``ray.init`` replaces the driver's SIGTERM handler with ``sys.exit(15)`` as it starts: a
    SIGTERM while Ray started then ended orchard with status 15 instead of 143, or was lost inside
    Ray's start-up (the run went on and FINISHED). While this holds, Ray's ``set_sigterm_handler``
    does nothing and the driver's own handler stays; Ray has no option for it."""
    from ray._private import utils

    original = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = original


def stop_autoscaler_monitor() -> bool:
    """Kill the autoscaler monitor of the Ray this process started, just before ``ray.shutdown()``.

    ``ray.shutdown()`` stops the GCS first and the monitor after it; the monitor's SIGTERM handler
    then tries to tell the (gone) GCS that the autoscaler failed, and Ray waits one second before
    it kills it anyway: a second on the exit of every run. A monitor of an embedded, single-machine
    Ray has nothing to hand on, so it gets the SIGKILL it would get a second later, now. No public
    API reaches Ray's own processes. Returns whether one was killed."""
    import subprocess

    from ray._private import ray_constants, worker

    node = worker._global_node
    if node is None or not node.is_head():
        return False
    killed = False
    for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
        if info.process.poll() is None:
            info.process.kill()
            killed = True
            try:  # reaped here, so shutdown finds it gone and moves on
                info.process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # stuck in the kernel: Ray's own stop deals with it
                pass
    return killed


def setup_hook_environment(hook: str) -> dict[str, str]:
    """The environment variable through which a Ray worker process finds its
    ``runtime_env["worker_process_setup_hook"]`` (a module path) as it starts. Set in the
    environment an embedded Ray inherits, every worker runs the hook without a job runtime_env:
    any job runtime_env, even environment variables alone, makes Ray start fresh worker
    processes for the job instead of taking the ones it prestarted (the first tasks of a run
    came ~1 s later on 2 cores). Ray reads the hook from this variable itself (its workers'
    ``default_worker.py``); no public option sets it."""
    from ray._private import ray_constants

    return {ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR: hook}


@contextlib.contextmanager
def without_api_server(skip: bool = True):
    """While this holds, a Ray started here starts no API-server process (``include_dashboard=False``).

    With the dashboard off, Ray 2.60 still starts its dashboard head process with one module
    (usage statistics) and no HTTP server, and ``ray.init`` waits until that process has
    registered its address: 1-1.7 s of every embedded run's start on 2 cores (``ray.init``
    2.0-2.1 s without it, 2.9-3.9 s with it), and a Python process's start of CPU beside the
    run's first tasks. Nothing an embedded run uses needs it: the job and state APIs are not
    loaded in that mode. What is kept is the address it registers, so that the state API's
    clients (Ray Train's placement-group cleaner) fail as before, with the "API server
    unavailable" error they handle, rather than a ``ConnectionError`` that ends the cleaner's
    loop: an address nothing can listen on (port 0). Ray has no option to leave the process out."""
    if not skip:
        yield
        return
    from ray._private import ray_constants, services

    def no_api_server(include_dashboard, raise_on_failure, host, gcs_address, cluster_id_hex, *args, **kwargs):
        from ray._raylet import GcsClient

        key = ray_constants.DASHBOARD_ADDRESS
        GcsClient(address=gcs_address, cluster_id=cluster_id_hex).internal_kv_put(
            key if isinstance(key, bytes) else key.encode(), b"127.0.0.1:0", True,
            ray_constants.KV_NAMESPACE_DASHBOARD)
        return None, None  # no dashboard URL, no process for Ray to stop

    original = services.start_api_server
    services.start_api_server = no_api_server
    try:
        yield
    finally:
        services.start_api_server = original


# ---------------------------------------------------------------- the torch process group (process_group.py)
def torch_training_framework():
    """Ray Train's tag for a torch group (what ``TorchConfig.framework`` says)."""
    from ray.train.v2._internal.util import TrainingFramework

    return TrainingFramework.TORCH


def train_worker_address_and_port() -> tuple[str, int]:
    """On a Train worker: its node's address and a free port, where rank 0's store listens."""
    from ray.train._internal.utils import get_address_and_port

    return get_address_and_port()


def join_torch_process_group(backend: str, world_rank: int, world_size: int, timeout_s: int) -> None:
    """On a Train worker: the environment ``init_process_group`` reads (LOCAL_RANK and the rest),
    then Ray Train's own setup of the process group (``env://``)."""
    from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group

    _set_torch_distributed_env_vars()
    _setup_torch_process_group(backend=backend, world_rank=world_rank, world_size=world_size,
                               init_method="env://", timeout_s=timeout_s)


def leave_torch_process_group(destroy: bool) -> None:
    """On a Train worker: Ray Train's own teardown of the process group."""
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)
