"""Resource sampling on every Ray node of a run: CPU/RAM through psutil, GPU utilization and
memory through NVML (nvidia-ml-py).  The thesis reports GPU utilization as mean/std per worker
(Table 5.3), so each series is kept and summarized at the end of the run.

Series keys, all under MLflow's ``system/`` prefix: ``system/<node>/cpu_pct`` (the whole machine,
every user), ``system/<node>/run_cpu_pct`` (the run's own processes only: the driver's process tree,
which holds an embedded Ray's raylet and every worker it started; on the driver's node only, since
a shared cluster's other nodes run other jobs' workers too), ``system/<node>/mem_pct``,
``system/<node>/gpu<i>/util_pct``, ``system/<node>/gpu<i>/mem_pct``; summaries add ``_mean`` and
``_std`` per series plus run-level ``system/cpu_pct_mean|std``, ``system/run_cpu_pct_mean|std`` and
``system/gpu_util_pct_mean|std``. Both CPU figures are percent of all the node's cores.  Only the GPUs that the run's workers hold are sampled
(``RunContext.claim_gpus``, called by every Train worker): a node's other GPUs belong to
other jobs, and NVML itself ignores CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import statistics
from typing import Any

import ray

from orchard import background


class NvmlReader:
    """Reads GPU utilization and memory through an NVML module (``pynvml`` or a test fake)."""

    def __init__(self, nvml: Any = None):
        self.nvml = None
        self.handles = []
        try:
            if nvml is None:
                import pynvml as nvml  # provided by nvidia-ml-py
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            self.nvml = nvml
        except Exception:  # no driver, no GPU: CPU-only sampling
            self.handles = []

    def read(self) -> list[dict[str, float]]:
        out = []
        for handle in self.handles:
            util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append({"util_pct": float(util.gpu), "mem_pct": 100.0 * float(mem.used) / float(mem.total)})
        return out


class RunCpu:
    """Percent of the node's cores the run's own process tree used since the last reading."""

    def __init__(self, root_pid: int):
        import os
        import time

        import psutil

        from orchard.tracking.process_cpu import OwnCpu

        self.cores, self.clock = os.cpu_count() or 1, time.monotonic
        self.own = OwnCpu(psutil.Process(root_pid))
        self.last_s, self.last_t = self.own.sample(), self.clock()

    def read(self) -> float:
        used, now = self.own.sample(), self.clock()
        pct = 100.0 * (used - self.last_s) / max(now - self.last_t, 1e-6) / self.cores
        self.last_s, self.last_t = used, now
        return min(100.0, max(0.0, pct))


def sample_once(node: str, nvml: NvmlReader, gpu_ids=None, run_cpu: RunCpu | None = None) -> dict[str, float]:
    """One sample of this machine: ``{series_key: value}``; GPUs limited to ``gpu_ids`` if given."""
    import psutil

    sample = {
        f"system/{node}/cpu_pct": psutil.cpu_percent(interval=None),
        f"system/{node}/mem_pct": psutil.virtual_memory().percent,
    }
    if run_cpu is not None:
        sample[f"system/{node}/run_cpu_pct"] = run_cpu.read()
    for i, gpu in enumerate(nvml.read()):
        if gpu_ids is not None and i not in gpu_ids:
            continue
        sample[f"system/{node}/gpu{i}/util_pct"] = gpu["util_pct"]
        sample[f"system/{node}/gpu{i}/mem_pct"] = gpu["mem_pct"]
    return sample


class NodeSampler:
    """Samples its node every ``interval_s`` seconds into the run's context: a thread in the
    driver's own process on the driver's node (a process fewer for every run to start and wait
    for at its end), a ``ResourceSampler`` actor pinned to each other node."""

    def __init__(self, ctx, node: str, interval_s: float, nvml: Any = None, run_root: tuple | None = None):
        import psutil

        psutil.cpu_percent(interval=None)  # the first reading is meaningless; prime it
        self.ctx, self.node, self.interval = ctx, node, interval_s
        self.nvml = NvmlReader(nvml)
        self.node_id = ray.get_runtime_context().get_node_id()
        # run_root: (driver node id, driver pid): the run's own CPU is read where the driver runs
        self.run_cpu = None
        if run_root and run_root[0] == self.node_id:
            try:
                self.run_cpu = RunCpu(run_root[1])
            except psutil.Error:  # the driver is not visible from here (another PID namespace)
                self.run_cpu = None
        self.step = 0
        # a sample that fails (the sink restarting, NVML busy) is taken again at the next tick
        self._poller = background.Poller(self.sample, interval_s, "orchard-system-metrics")
        self._poller.start()

    def sample(self) -> dict[str, float]:
        claimed = ray.get(self.ctx._sink.claimed_gpus.remote(self.node_id)) if self.nvml.handles else []
        values = sample_once(self.node, self.nvml, set(claimed), self.run_cpu)
        self.ctx.log_metrics(values, step=self.step, keep_series=True)
        self.step += 1
        return values

    def gpu_count(self) -> int:
        return len(self.nvml.handles)

    def stop(self, timeout_s: float | None = None) -> int:
        self._poller.stop(timeout_s=5)
        self.sample()  # at least one sample even for runs shorter than the interval
        self.ctx.flush(timeout_s)
        return self.step


ResourceSampler = ray.remote(num_cpus=0)(NodeSampler)


def node_names() -> dict[str, str]:
    """Ray node id -> short stable name (``node0``, ``node1`` ... in address order)."""
    alive = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: (n["NodeManagerAddress"], n["NodeID"]))
    return {n["NodeID"]: f"node{i}" for i, n in enumerate(alive)}


def start_samplers(ctx, interval_s: float, nvml: Any = None) -> list:
    """One sampler on each alive node of the cluster: the driver's node's in this process (it
    also reads the run's own CPU, the driver's process tree), an actor pinned to each other one."""
    import copy
    import os

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    run_root = (here, os.getpid())
    samplers = []
    for node_id, name in node_names().items():
        if node_id == here:  # the context as a worker gets it: no sweep's metric feed, no time split
            samplers.append(NodeSampler(copy.copy(ctx), name, interval_s, nvml, run_root))
            continue
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        samplers.append(ResourceSampler.options(scheduling_strategy=strategy).remote(ctx, name, interval_s, nvml,
                                                                                      run_root))
    return samplers


def summarize(series: dict[str, list[float]]) -> dict[str, float]:
    """Mean and std of each series, plus run-level CPU and GPU figures across nodes/GPUs."""
    out: dict[str, float] = {}
    pooled: dict[str, list[float]] = {"system/cpu_pct": [], "system/run_cpu_pct": [], "system/mem_pct": [],
                                      "system/gpu_util_pct": [], "system/gpu_mem_pct": []}
    for key, values in series.items():
        if not values:
            continue
        out[f"{key}_mean"] = statistics.fmean(values)
        out[f"{key}_std"] = statistics.pstdev(values)
        parts = key.split("/")  # system/<node>/[gpu<i>/]<what>
        pooled_key = f"system/gpu_{parts[-1]}" if len(parts) == 4 else f"system/{parts[-1]}"
        if pooled_key in pooled:
            pooled[pooled_key].extend(values)
    for key, values in pooled.items():
        if values:
            out[f"{key}_mean"] = statistics.fmean(values)
            out[f"{key}_std"] = statistics.pstdev(values)
    return out


def stop_samplers(samplers: list, timeout_s: float = 30.0) -> None:
    """Each sampler's last sample, flushed: the actors' asked first, so they stop while this
    process's own one does."""
    actors = [s for s in samplers if not isinstance(s, NodeSampler)]
    stopping = [s.stop.remote() for s in actors]
    for sampler in samplers:
        if isinstance(sampler, NodeSampler):
            sampler.stop(timeout_s)
    if stopping:
        ray.get(stopping, timeout=timeout_s)
        for actor in actors:
            ray.kill(actor)
