"""Training architectures of section 5.1 on Ray actors, as configuration (conf/singa/arch/*.yaml).

    local       one worker group, local updates (the single-node baseline)
    sync_ps     Sandblaster-like: worker groups push to sharded servers, which apply the averaged
                update once every group pushed for the step (= one group with a bigger batch)
    async_ps    Downpour: each push is applied at once, by AdaGrad on the servers as Dean et al.
                ran it (``server_updater``); optional parameter sampling (6.5.1)
    replicated  several server groups, each holding all parameters and serving its own worker
                groups; the replicas exchange (average) their parameters every ``sync_every`` steps
    allreduce   serverless: groups average gradients with a gloo all-reduce, update locally

The parameter servers are orchard's shared core (``orchard.strategies.ps``); worker groups,
replica exchange and sampling are SINGA-specific and live here.  The model never sees which
architecture runs it: every group is the same ``WorkerGroup``.
"""
from __future__ import annotations

import socket
import time

import numpy as np
import ray
import torch

from workloads.singa.worker_group import WorkerGroup

ARCHITECTURES = ("local", "sync_ps", "async_ps", "replicated", "allreduce")


@ray.remote
class GroupActor:
    """A worker group in its own process; talks to servers or peers as its architecture says."""

    def __init__(self, spec: dict, rank: int, num_groups: int):
        self.group = WorkerGroup(spec, rank, num_groups)
        self.rank, self.num_groups = rank, num_groups
        self.client = None
        self.bytes = 0
        self.comm_s = 0.0

    def info(self) -> dict:
        return {"steps_per_epoch": self.group.steps_per_epoch, "plan": self.group.plan(),
                "num_params": int(sum(v.size for v in self.group.get_params().values()))}

    def get_params(self) -> dict:
        return self.group.get_params()

    def set_params(self, params: dict) -> None:
        self.group.set_params(params)

    def evaluate(self, pull: bool = False) -> dict:
        if pull and self.client is not None:
            self.group.set_params(self.client.pull())
        return self.group.evaluate()

    def stats(self) -> dict:
        return {**self.group.stats(), "comm_bytes": self.bytes, "comm_s": self.comm_s}

    # -- parameter servers -----------------------------------------------------------------------
    def connect_ps(self, ps_group, worker_index: int) -> None:
        from orchard.strategies.ps import PSClient

        self.client = PSClient(ps_group, worker_index)
        self.group.set_params(self.client.pull())

    def run_ps(self, steps: int, sample_ratio: float = 1.0) -> dict:
        """``steps`` iterations of compute -> fused push/pull (sampled names when ratio < 1)."""
        from orchard.strategies.ps import payload_bytes, sampled_names

        names = sorted(self.group.get_params())
        metrics = {}
        for _ in range(steps):
            metrics = self.group.compute()
            grads = self.group.server_gradients()
            if sample_ratio < 1.0:
                keep = sampled_names(names, sample_ratio, self.group.step, self.rank)
                grads = {n: grads[n] for n in keep}
            t0 = time.perf_counter()
            # Sampling relieves the servers both ways: only the pushed parameters come back.
            fresh = self.client.push_pull(grads, self.group.step, only_pushed=sample_ratio < 1.0)
            self.comm_s += time.perf_counter() - t0
            # What crossed the wire: our gradients up, the answering shards' parameters down.
            self.bytes += payload_bytes(grads) + payload_bytes(fresh)
            self.group.set_params(fresh)
            self.group.advance()
        return metrics

    # -- all-reduce ------------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return "127.0.0.1", s.getsockname()[1]

    def join_allreduce(self, host: str, port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.num_groups)

    def run_allreduce(self, steps: int) -> dict:
        import torch.distributed as dist

        metrics = {}
        for _ in range(steps):
            metrics = self.group.compute()
            grads = self.group.net.get_grads()
            names = sorted(grads)
            flat = torch.from_numpy(np.concatenate([grads[n].ravel() for n in names]))
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            self.comm_s += time.perf_counter() - t0
            flat /= self.num_groups
            # Ring all-reduce moves 2 (K-1)/K of the buffer through every member.
            self.bytes += int(2 * (self.num_groups - 1) / self.num_groups * flat.numel() * 4)
            out, pos = {}, 0
            for n in names:
                out[n] = flat[pos:pos + grads[n].size].reshape(grads[n].shape).numpy()
                pos += grads[n].size
            self.group.apply_update(out)
        return metrics

    def leave_allreduce(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # -- local ------------------------------------------------------------------------------------
    def run_local(self, steps: int) -> dict:
        metrics = {}
        for _ in range(steps):
            metrics = self.group.local_step()
        return metrics


def server_optimizer(updater: dict, server_updater: dict | None = None) -> dict:
    """The core PS optimizer spec for a SINGA updater conf (same rule, fixed base lr).
    ``server_updater`` (an arch preset's, e.g. Downpour's AdaGrad) replaces the app's rule and
    whatever keys it sets; weight decay stays the app's unless it sets its own."""
    if server_updater:
        keep = {"weight_decay": updater["weight_decay"]} if "weight_decay" in updater else {}
        updater = {**keep, **server_updater}
    spec = {"name": updater.get("name", "sgd"), "lr": float(updater.get("lr", 0.01)),
            "momentum": float(updater.get("momentum", 0.0)), "weight_decay": float(updater.get("weight_decay", 0.0))}
    if spec["name"] == "adam":
        spec["betas"] = (float(updater.get("beta1", 0.9)), float(updater.get("beta2", 0.999)))
    return spec


class Architecture:
    """Starts the groups (and servers) of one architecture and runs them in rounds of steps."""

    def __init__(self, arch: dict, spec: dict, cpus_per_group: float):
        self.arch, self.spec = arch, spec
        self.name = arch["name"]
        self.num_groups = int(arch["worker_groups"])
        opts = {"num_cpus": cpus_per_group}
        self.actors = [GroupActor.options(**opts).remote(spec, r, self.num_groups) for r in range(self.num_groups)]
        infos = ray.get([a.info.remote() for a in self.actors])
        self.steps_per_epoch = min(i["steps_per_epoch"] for i in infos)
        self.plan = infos[0]["plan"]
        self.num_params = infos[0]["num_params"]
        self.ps_groups = []
        self.exchange_bytes = 0
        self.sample_ratio = float(arch.get("sample_ratio", 1.0) or 1.0)
        params = ray.get(self.actors[0].get_params.remote())
        if self.name in ("sync_ps", "async_ps", "replicated"):
            from orchard.strategies.ps import PSGroup

            replicas = int(arch.get("server_groups", 1)) if self.name == "replicated" else 1
            for r in range(replicas):
                members = [g for g in range(self.num_groups) if g % replicas == r]
                self.ps_groups.append(PSGroup.create(
                    params, num_servers=int(arch["servers_per_group"]), num_workers=len(members),
                    mode=arch.get("mode", "sync"),
                    optimizer=server_optimizer(spec["updater"], arch.get("server_updater")),
                    cpus_per_server=float(arch.get("cpus_per_server", 0))))
            ray.get([a.connect_ps.remote(self.ps_groups[g % replicas], _index_in(g, replicas))
                     for g, a in enumerate(self.actors)])
        elif self.name == "allreduce" and self.num_groups > 1:
            host, port = ray.get(self.actors[0].address.remote())
            ray.get([a.join_allreduce.remote(host, port) for a in self.actors])
        else:
            ray.get([a.set_params.remote(params) for a in self.actors[1:]])

    def round_length(self) -> int:
        if self.name == "replicated":
            return max(1, min(int(self.arch.get("sync_every", 10)), self.steps_per_epoch))
        return self.steps_per_epoch

    def run_steps(self, steps: int) -> dict:
        """Every group runs ``steps`` iterations (in parallel); returns group 0's last metrics."""
        if self.name in ("sync_ps", "async_ps", "replicated"):
            refs = [a.run_ps.remote(steps, self.sample_ratio) for a in self.actors]
        elif self.name == "allreduce" and self.num_groups > 1:
            refs = [a.run_allreduce.remote(steps) for a in self.actors]
        else:
            refs = [a.run_local.remote(steps) for a in self.actors]
        metrics = ray.get(refs)[0]
        if self.name == "replicated" and len(self.ps_groups) > 1:
            self.exchange()
        return metrics

    def exchange(self) -> None:
        """Replicas average their parameters (each keeps its optimizer state)."""
        states = [g.state() for g in self.ps_groups]
        names = [n for sh in states[0]["shards"] for n in (sh["params"] or {})]
        mean = {}
        for n in names:
            mean[n] = np.mean([next(sh["params"][n] for sh in st["shards"] if n in (sh["params"] or {}))
                               for st in states], axis=0).astype(np.float32)
        for g, st in zip(self.ps_groups, states):
            for sh in st["shards"]:
                sh["params"] = {n: mean[n] for n in sh["params"]}
            g.load_state(st)
        # every replica sends its parameters and receives the average
        self.exchange_bytes += 2 * len(self.ps_groups) * sum(v.nbytes for v in mean.values())

    def evaluate(self) -> dict:
        return ray.get(self.actors[0].evaluate.remote(pull=bool(self.ps_groups)))

    def params(self) -> dict:
        if self.ps_groups:
            from orchard.strategies.ps import PSClient

            return PSClient(self.ps_groups[0], 0).pull()
        return ray.get(self.actors[0].get_params.remote())

    def stats(self) -> dict:
        per = ray.get([a.stats.remote() for a in self.actors])
        steps = max(1, per[0]["steps"])
        worker_bytes = sum(p["comm_bytes"] for p in per)
        return {"steps": per[0]["steps"], "compute_s": per[0]["compute_s"],
                "comm_s": per[0]["comm_s"],
                "comm_bytes_per_step": (worker_bytes + self.exchange_bytes) / steps,
                "bridge_bytes_per_step": sum(p["bridge_bytes"] for p in per) / steps,
                "group_param_bytes_per_step": sum(p["group_param_bytes"] for p in per) / steps}

    def shutdown(self) -> None:
        if self.name == "allreduce" and self.num_groups > 1:
            ray.get([a.leave_allreduce.remote() for a in self.actors])
        for g in self.ps_groups:
            g.shutdown()
        for a in self.actors:
            ray.kill(a)


def _index_in(group: int, replicas: int) -> int:
    """Worker index of ``group`` among the groups subscribed to its server replica."""
    return group // replicas
