"""The torch process group of a Ray Train group, set up by a controller that never imports torch.

Ray Train's ``TorchConfig`` lives in ``ray.train.torch.config``, which imports torch at its top;
the config travels to the group's controller (an actor, a process of its own) inside the
callbacks it is started with, so every controller imported torch only to unpickle it, before it
started a worker: 2 s of CPU on the critical path of every flower and video group's start (and
restart) on 2 cores, more with CUDA's libraries. ``ProcessGroupConfig`` is the same setup from a
module that imports no torch: the controller only sends the workers functions to run, by
reference, and the workers, which import torch anyway, import Ray's own setup inside them
(``orchard/cluster/ray_private.py``, where orchard's uses of Ray's internals live). What
``on_start`` does is ``ray.train.torch.config._TorchBackend.on_start`` for the backends orchard
runs (gloo, nccl) with ``env://`` rendezvous; TPUs are not among them.

Ray Train's side of orchard, like ``worker.py``: it imports ``ray.train``, which the flower and
video extras bring (``launch`` imports this module when a group starts).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import ray
from ray.train.backend import Backend, BackendConfig

from orchard.cluster import ray_private


@dataclass
class ProcessGroupConfig(BackendConfig):
    """``TorchConfig``'s fields and meaning (``backend`` None: nccl with GPUs, else gloo, which
    ``TorchTrainer`` decides on the driver), importable without torch."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800
    # ``strategy.worker_niceness``: each worker lowers its own priority by this much before it
    # imports torch (``_rendezvous_at``), so its start and its steps take the CPU the run's other
    # processes leave (video: the pipeline that feeds it); 0 leaves Ray's worker priority
    niceness: int = 0

    @property
    def backend_cls(self):
        return _ProcessGroupBackend

    @property
    def train_func_context(self):  # read on the driver (the trainer's constructor), which has torch
        from ray.train.torch.config import TorchConfigContextManager

        return TorchConfigContextManager

    @property
    def framework(self):
        return ray_private.torch_training_framework()

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s,
                "niceness": self.niceness}


class _ProcessGroupBackend(Backend):
    share_cuda_visible_devices: bool = True  # as Ray's: the workers on a node see each other's GPUs

    def on_start(self, worker_group, backend_config: ProcessGroupConfig) -> None:
        if backend_config.init_method != "env":
            raise ValueError(f"strategy: a process group is set up with init_method 'env'; got {backend_config.init_method!r}")
        backend = backend_config.backend or ("nccl" if worker_group.get_resources_per_worker().get("GPU", 0) else "gloo")
        address, port = worker_group.execute_single(0, ray_private.train_worker_address_and_port)
        worker_group.execute(_rendezvous_at, address=address, port=port, niceness=backend_config.niceness)
        ray.get([worker_group.execute_single_async(rank, ray_private.join_torch_process_group, backend=backend,
                                                   world_rank=rank, world_size=len(worker_group),
                                                   timeout_s=backend_config.timeout_s)
                 for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config) -> None:
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S as DEFAULT_S,
                                         TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S as VARIABLE)

        futures = worker_group.execute_async(ray_private.leave_torch_process_group, destroy=len(worker_group) > 1)
        try:  # Ray Train's own bound, as it reads it
            ray.get(futures, timeout=int(os.environ.get(VARIABLE, DEFAULT_S)))
        except GetTimeoutError:  # as Ray's: a group that hangs on its way out is left to Ray Train
            pass


def _rendezvous_at(address: str, port: int, niceness: int = 0) -> None:
    """On each worker, before it imports torch: where rank 0 listens, and its priority."""
    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)
    lower_priority(niceness)


# the increment this worker process applied already: a group started again in the same process
# (a restart) must not lower it twice
_applied_niceness = 0


def lower_priority(niceness: int) -> None:
    """Raise this process's nice value by ``niceness`` over its start, once per process (a
    lower priority cannot be taken back without privileges); where nice is missing (Windows)
    or refused, the process keeps its priority."""
    global _applied_niceness
    step = int(niceness) - _applied_niceness
    if step <= 0:
        return
    try:
        os.nice(step)
    except (AttributeError, OSError):
        return
    _applied_niceness = int(niceness)
