"""Distribution strategies shared by the workloads.

- ``ring``: Ray Train TorchTrainer + DDP all-reduce (gloo on CPU, NCCL on GPU).
- ``ps``: parameter-server actors (``ps.py``) with sync or async (Downpour) updates, workers
  under the same TorchTrainer launcher.
- ``tasks``: plain Ray tasks and actors, partitioned by the workload itself (forest).

``launch`` starts a per-worker loop; ``worker`` is what the loop calls on each worker.
"""
from orchard.strategies.launch import launch

__all__ = ["launch"]
