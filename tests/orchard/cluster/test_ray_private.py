"""The private Ray APIs orchard relies on are where orchard/cluster/ray_private.py expects them, and
nothing else in orchard reaches into ``ray._private``: a Ray upgrade that moves one fails here,
by name."""
from __future__ import annotations

import ast
import importlib
import time
from pathlib import Path

import pytest

from orchard.cluster import ray_private

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("module", "attribute"), [
    ("ray._private.auto_init_hook", "enable_auto_connect"),
    ("ray._private.services", "get_node_ip_address"),
    ("ray._private.services", "ConsolePopen"),
    ("ray._private.services", "start_api_server"),
    ("ray._private.ray_constants", "PROCESS_TYPE_MONITOR"),
    ("ray._private.ray_constants", "WORKER_PROCESS_SETUP_HOOK_ENV_VAR"),
    ("ray._private.ray_constants", "DASHBOARD_ADDRESS"),
    ("ray._private.ray_constants", "KV_NAMESPACE_DASHBOARD"),
    ("ray._private.worker", "_global_node"),
    ("ray._raylet", "GcsClient"),
    ("ray._private.utils", "detect_fate_sharing_support"),
    ("ray._private.utils", "get_num_cpus"),
    ("ray._private.utils", "set_sigterm_handler"),
    ("ray._private.accelerators", "get_accelerator_manager_for_resource"),
    ("ray._private.state", "actors"),
    ("ray._private.state", "state"),
    ("ray._private.worker", "global_worker"),
    ("ray.core.generated.gcs_pb2", "PlacementGroupTableData"),
    ("ray.core.generated.gcs_service_pb2", "GetClusterIdRequest"),
    ("ray.core.generated.gcs_service_pb2_grpc", "NodeInfoGcsServiceStub"),
    ("ray.data._internal.execution.execution_callback", "ExecutionCallback"),
    ("ray.data._internal.logging", "configure_logging"),
    ("ray.train.v2._internal.callbacks.datasets", "DatasetsCallback"),
    ("ray.train.v2._internal.callbacks.placement_group_callback", "PlacementGroupCleanerCallback"),
    ("ray.train.v2._internal.execution.scaling_policy.fixed", "FixedScalingPolicy"),
    ("ray.train.v2.api.data_parallel_trainer", "DataParallelTrainer"),
])
def test_every_private_ray_name_orchard_uses_still_exists(module, attribute):
    assert hasattr(importlib.import_module(module), attribute), f"Ray moved {module}.{attribute}"


def test_the_placement_group_record_still_has_the_creator_fields():
    from ray.core.generated import gcs_pb2

    fields = set(gcs_pb2.PlacementGroupTableData.DESCRIPTOR.fields_by_name)
    assert {"creator_job_id", "creator_actor_id", "creator_actor_dead", "is_detached", "state",
            "placement_group_id"} <= fields


@pytest.mark.parametrize("logger", [ray_private.TOKEN_SETUP_LOGGER, *ray_private.TRAIN_CHATTY_LOGGERS,
                                    ray_private.TRAIN_PG_CLEANER_LOGGER])
def test_the_ray_loggers_orchard_quiets_are_still_rays_modules(logger):
    importlib.import_module(logger)  # a module Ray renamed: its logger name no longer matches anything


def test_the_resources_detected_before_ray_are_this_machines(monkeypatch):
    """What ``detected_resources`` says before any Ray starts: this process's cores (no more than
    its CPU affinity allows), and no GPU where CUDA_VISIBLE_DEVICES hides them all."""
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    found = ray_private.detected_resources()
    assert 1 <= found["CPU"] <= len(os.sched_getaffinity(0)) and found["GPU"] == 0


def test_a_lean_trainer_leaves_out_only_the_callbacks_nothing_uses(ray_session):
    """The callback that starts Train's ``DatasetManager`` actor is left out only where no
    dataset needs it, the placement-group cleaner only where no state API answers; every other
    default callback of Ray Train stays."""
    import ray.data
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    def kinds(trainer):
        return [type(cb) for cb in trainer._create_default_callbacks()]

    plain = kinds(TorchTrainer(lambda: None))
    assert {DatasetsCallback, PlacementGroupCleanerCallback} <= set(plain)
    bare = kinds(ray_private.lean_trainer(TorchTrainer)(lambda: None))
    assert bare == [k for k in plain if k is not DatasetsCallback]
    blind = kinds(ray_private.lean_trainer(TorchTrainer, state_api=False)(lambda: None))
    assert blind == [k for k in plain if k not in (DatasetsCallback, PlacementGroupCleanerCallback)]
    with_data = ray_private.lean_trainer(TorchTrainer)(lambda: None, datasets={"train": ray.data.range(4)})
    assert DatasetsCallback in kinds(with_data)


@pytest.mark.parametrize(("registered", "serves"), [(None, False), (b"127.0.0.1:0", False), (b"10.0.0.5:8265", True)])
def test_the_state_api_is_there_only_where_a_dashboard_registered_a_port(monkeypatch, registered, serves):
    """What the GCS holds under the dashboard's key: nothing (no dashboard), port 0 (a Ray started
    without its API server, as a run embeds it), or the API server's address. Only the last serves
    the state API, so only there do a driver's Train runs start Ray Train's placement-group cleaner."""
    import ray.experimental.internal_kv as internal_kv

    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key, namespace=None: registered)
    assert ray_private.has_state_api() is serves


@pytest.mark.parametrize("embedded", [True, False])
def test_a_fixed_group_on_an_embedded_ray_asks_no_autoscaler_for_its_workers(ray_session, monkeypatch, embedded):
    """On an embedded Ray the controller's fixed-size policy decides as Ray's does but never
    reaches for the autoscaling coordinator (whose client it would need); attached, Ray's own
    policy goes to the controller unchanged. The controller is not started: the policy it would
    get is caught on its way there."""
    from types import SimpleNamespace

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.execution.scaling_policy import ResizeDecision
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    sent = {}
    monkeypatch.setattr(DataParallelTrainer, "_initialize_and_run_controller",
                        lambda self, **kwargs: sent.update(kwargs) or SimpleNamespace(error=None))
    lean = ray_private.lean_trainer(TorchTrainer, embedded=embedded)
    lean(lambda: None, scaling_config=ScalingConfig(num_workers=2)).fit()
    policy = sent["scaling_policy"]
    assert isinstance(policy, FixedScalingPolicy) and (type(policy) is FixedScalingPolicy) is not embedded
    if embedded:
        policy.after_controller_start(SimpleNamespace(run_id="r"))
        decision = policy.make_decision_for_non_running_worker_group()
        assert isinstance(decision, ResizeDecision) and decision.num_workers == 2
        assert policy._coordinator_client is None
    elastic = lean(lambda: None, scaling_config=ScalingConfig(num_workers=(1, 2)))
    elastic.fit()
    assert not isinstance(sent["scaling_policy"], FixedScalingPolicy)  # the coordinator sizes it


def test_an_elastic_group_that_stopped_sizes_its_restart_from_the_nodes_read_then(ray_session, monkeypatch):
    """Ray's elastic policy caches the coordinator's view of the nodes for 1 s; the lean trainer's
    reads it anew for the first decision after the group stopped running (a node lost), and keeps
    the cache for the decisions that follow while it waits for its minimum. The view here is
    counted: the cached one holds two workers' CPUs (the lost node's too), the one read after the
    stop one worker's."""
    from types import SimpleNamespace

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.execution.scaling_policy import NoopDecision, ResizeDecision
    from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    sent = {}
    monkeypatch.setattr(DataParallelTrainer, "_initialize_and_run_controller",
                        lambda self, **kwargs: sent.update(kwargs) or SimpleNamespace(error=None))
    config = ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=0.0)
    ray_private.lean_trainer(TorchTrainer)(lambda: None, scaling_config=config).fit()
    policy = sent["scaling_policy"]
    assert isinstance(policy, ElasticScalingPolicy) and type(policy) is not ElasticScalingPolicy
    views = iter([2, 1, 2])  # what the coordinator answers, one read after another
    reads = []

    def read_nodes(self):
        if time.monotonic() - self._latest_reserved_resources_query_time >= self.GET_RESERVED_RESOURCES_INTERVAL_S:
            self._latest_reserved_resources = next(views)
            self._latest_reserved_resources_query_time = time.monotonic()
            reads.append(self._latest_reserved_resources)
        return self._latest_reserved_resources

    monkeypatch.setattr(ElasticScalingPolicy, "_get_reserved_resources", read_nodes)
    monkeypatch.setattr(ElasticScalingPolicy, "_count_possible_workers", lambda self, workers: workers)
    monkeypatch.setattr(ElasticScalingPolicy, "_maybe_send_resource_request", lambda self: None)
    running = SimpleNamespace(start_time=float("-inf"), num_workers=2)
    assert isinstance(policy.make_decision_for_running_worker_group(running, None), NoopDecision)  # 2 of 2
    restart = policy.make_decision_for_non_running_worker_group()  # a moment later, the node lost
    assert isinstance(restart, ResizeDecision) and restart.num_workers == 1 and reads == [2, 1]
    policy.make_decision_for_non_running_worker_group()  # waiting on: the cache serves again
    assert reads == [2, 1]


def test_the_private_calls_work_on_a_live_ray(ray_session):
    assert ray_private.node_ip_address()
    assert isinstance(ray_private.placement_group_table(), list)
    assert ray_private.live_actor_handles("NoSuchActorClass") == []
    with ray_private.ray_children_in_their_own_group():
        pass


def test_cluster_notes_written_in_a_task_are_read_by_the_driver_and_cleared_by_prefix(ray_session):
    """The GCS notes that replaced the RecoveryLog actor: one process writes, another reads; a
    name is taken once (``overwrite=False`` says so and writes nothing); ``clear`` drops only
    its own prefix."""
    ray = ray_session
    notes, other = ray_private.ClusterNotes("test-notes/a/"), ray_private.ClusterNotes("test-notes/b/")
    other.put("kept", 1)

    @ray.remote(num_cpus=0)
    def write(n):
        return [n.put("start/000001", {"epoch": None}), n.put("start/000001", {"epoch": 3}, overwrite=False),
                n.put("start/000002", {"epoch": 3})]

    assert ray.get(write.remote(notes)) == [False, True, False]
    assert notes.names("start/") == ["start/000001", "start/000002"]
    assert [notes.get(n) for n in notes.names("start/")] == [{"epoch": None}, {"epoch": 3}]
    assert notes.get("missing") is None
    notes.clear()
    assert notes.names() == [] and other.get("kept") == 1
    other.clear()


def test_ray_trains_torch_setup_is_where_the_process_group_calls_it():
    # what orchard/strategies/process_group.py runs on the workers through ray_private, by name
    import ray.train.torch.config as torch_config
    from ray.train._internal import utils
    from ray.train.v2._internal.util import TrainingFramework

    for name in ("_set_torch_distributed_env_vars", "_setup_torch_process_group", "_shutdown_torch"):
        assert callable(getattr(torch_config, name)), name
    assert callable(utils.get_address_and_port) and ray_private.torch_training_framework() is TrainingFramework.TORCH


@pytest.mark.slow
def test_nothing_else_in_orchard_or_the_workloads_reaches_into_ray_internals():
    offenders = []
    for path in sorted([*(ROOT / "orchard").rglob("*.py"), *(ROOT / "workloads").rglob("*.py")]):
        if path.name == "ray_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute) and node.attr == "_private":
                names = ["ray._private"]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.startswith("ray.") and ("._private" in n or "._internal" in n)]
    assert offenders == [], "private Ray APIs belong in orchard/cluster/ray_private.py"
