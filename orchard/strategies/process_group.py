"""The torch process group of a Ray Train group, set up by a controller that never imports torch.

Ray Train's ``TorchConfig`` lives in ``ray.train.torch.config``, which imports torch at its top;
the config travels to the group's controller (an actor, a process of its own) inside the
callbacks it is started with, so every controller imported torch only to unpickle it, before it
started a worker: 2 s of CPU on the critical path of every flower and video group's start (and
restart) on 2 cores, more with CUDA's libraries. ``ProcessGroupConfig`` is the same setup from a
module that imports no torch: the controller only sends the workers functions to run, by
reference to this module, and the workers, which import torch anyway, import Ray's own setup
functions inside them. What ``on_start`` does is ``ray.train.torch.config._TorchBackend.on_start``
for the backends orchard runs (gloo, nccl) with ``env://`` rendezvous; TPUs are not among them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import ray
from ray.train.backend import Backend, BackendConfig


@dataclass
class ProcessGroupConfig(BackendConfig):
    """``TorchConfig``'s fields and meaning (``backend`` None: nccl with GPUs, else gloo, which
    ``TorchTrainer`` decides on the driver), importable without torch."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _ProcessGroupBackend

    @property
    def train_func_context(self):  # read on the driver (the trainer's constructor), which has torch
        from ray.train.torch.config import TorchConfigContextManager

        return TorchConfigContextManager

    @property
    def framework(self):
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}


class _ProcessGroupBackend(Backend):
    share_cuda_visible_devices: bool = True  # as Ray's: the workers on a node see each other's GPUs

    def on_start(self, worker_group, backend_config: ProcessGroupConfig) -> None:
        if backend_config.init_method != "env":
            raise ValueError(f"strategy: a process group is set up with init_method 'env'; got {backend_config.init_method!r}")
        backend = backend_config.backend or ("nccl" if worker_group.get_resources_per_worker().get("GPU", 0) else "gloo")
        from ray.train._internal.utils import get_address_and_port

        address, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_rendezvous_at, address=address, port=port)
        ray.get([worker_group.execute_single_async(rank, _join_process_group, backend=backend, world_rank=rank,
                                                   world_size=len(worker_group), timeout_s=backend_config.timeout_s)
                 for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config) -> None:
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                         TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)

        futures = worker_group.execute_async(_leave_process_group, destroy=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:  # as Ray's: a group that hangs on its way out is left to Ray Train
            pass


# ---------------------------------------------------------------- run on the workers (they have torch)
def _rendezvous_at(address: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)


def _join_process_group(backend: str, world_rank: int, world_size: int, timeout_s: int) -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group

    _set_torch_distributed_env_vars()  # LOCAL_RANK and the rest, which init_process_group reads
    _setup_torch_process_group(backend=backend, world_rank=world_rank, world_size=world_size,
                               init_method="env://", timeout_s=timeout_s)


def _leave_process_group(destroy: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)
