"""Before a Train group takes GPUs: the torch that will use them must see them.

Ray hands a worker a GPU share from what a node declares (a GPU it detected, ``ray start
--num-gpus``), whatever torch is installed there: the CPU wheel, installed from the same
requirements as a laptop's, or a CUDA build that finds no driver. Ray Train then starts the group,
the worker fails deep in its loop (``pin_memory=True requires a CUDA ... backend``), and with
``strategy.max_failures`` the group restarts and fails again before the run ends. Asked first, the
run ends in one line naming the key instead.

On an embedded Ray the workers' torch is the driver's (one machine, one environment): it is asked
here, without a process. On an attached cluster one task holding the same GPU share asks on a node
that has it; a cluster whose GPUs are all taken, or that has none, answers nothing within the wait,
and the run goes on to Ray Train's own bound on a group's start.
"""
from __future__ import annotations

from orchard.errors import ConfigError

PROBE_WAIT_S = 60.0


def torch_gpu() -> tuple[bool, str]:
    """(whether torch here sees a CUDA device, which torch this is)."""
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
    return torch.cuda.is_available(), f"torch {torch.__version__} ({build})"


def check_gpus_usable(share: float, embedded: bool, wait_s: float = PROBE_WAIT_S) -> None:
    """Raise ``ConfigError("strategy.gpus_per_worker", ...)`` when the torch of the workers that
    would hold ``share`` of a GPU sees no CUDA device."""
    if embedded:
        seen, what = torch_gpu()
        where = "this machine, where"
    else:
        import ray

        # "DEFAULT": outside any placement group; a sweep trial's driver would otherwise place it in
        # its trial's group, which holds no GPU (the Train workers' own group does)
        probe = ray.remote(num_cpus=0, num_gpus=share, max_retries=0, scheduling_strategy="DEFAULT")(torch_gpu).remote()
        ready, _ = ray.wait([probe], timeout=wait_s)
        if not ready:  # no GPU free (or none at all): Ray Train's start bound says so, as before
            ray.cancel(probe, force=True)
            return
        seen, what = ray.get(probe)
        where = "a node of the cluster that has them, where"
    if not seen:
        amount = f"{share:g} of a GPU" if share < 1 else f"{share:g} GPU" + ("s" if share > 1 else "")
        raise ConfigError("strategy.gpus_per_worker", f"0, or workers whose torch sees their GPUs: Ray gives "
                          f"{amount} on {where} {what} finds no CUDA device (install a CUDA "
                          "build of torch there: docs/cluster.md, 'GPU nodes')")
