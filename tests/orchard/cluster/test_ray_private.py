"""The private Ray APIs orchard relies on are where orchard/cluster/ray_private.py expects them, and
nothing else in orchard reaches into ``ray._private``: a Ray upgrade that moves one fails here,
by name."""
from __future__ import annotations

import ast
import importlib
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


def test_a_trainer_given_no_datasets_starts_no_dataset_manager_and_one_given_some_keeps_it():
    """The callback that starts Train's ``DatasetManager`` actor is left out only where no
    dataset needs it; every other default callback of Ray Train stays."""
    import ray.data
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

    trainer_class = ray_private.trainer_without_idle_dataset_manager(TorchTrainer)

    def kinds(trainer):
        return [type(cb) for cb in trainer._create_default_callbacks()]

    bare, plain = kinds(trainer_class(lambda: None)), kinds(TorchTrainer(lambda: None))
    assert DatasetsCallback in plain and bare == [k for k in plain if k is not DatasetsCallback]
    with_data = trainer_class(lambda: None, datasets={"train": ray.data.range(4)})
    assert DatasetsCallback in kinds(with_data)


def test_the_private_calls_work_on_a_live_ray(ray_session):
    assert ray_private.node_ip_address()
    assert isinstance(ray_private.placement_group_table(), list)
    assert ray_private.live_actor_handles("NoSuchActorClass") == []
    with ray_private.ray_children_in_their_own_group():
        pass


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
