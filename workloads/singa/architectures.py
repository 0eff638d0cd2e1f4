"""Training architectures of section 5.1 on Ray actors, as configuration (conf/singa/arch/*.yaml).

    local       one worker group, local updates (the single-node baseline)
    sync_ps     Sandblaster-like: worker groups push to sharded servers, which apply the averaged
                update once every group pushed for the step (= one group with a bigger batch)
    async_ps    Downpour: each push is applied at once, by AdaGrad on the servers as Dean et al.
                ran it (``server_updater``); optional random parameter sampling (6.5.1)
    replicated  several server groups, each holding all parameters and serving its own worker
                groups; the replicas exchange (average) their parameters every ``sync_every`` steps
    allreduce   serverless: groups average gradients with a gloo all-reduce, update locally

With servers, a group pushes every ``sync_every`` steps (Downpour's n_push = n_fetch): its
gradients accumulate in between and go up as one sum.  Weight decay is added by the groups with
each parameter's ``wd_mult`` (the servers run the update rule with no decay of their own).

The parameter servers are orchard's shared core (``orchard.strategies.ps``); worker groups,
replica exchange and sampling are SINGA-specific and live here.  The model never sees which
architecture runs it: every group is the same ``WorkerGroup``.  Groups are spread over the
cluster's nodes; peers reach each other at their node's address (Ray actor calls to the
servers; the all-reduce rendezvous binds the node IP of group 0, never a loopback).  A node lost
under a group or a server ends the round with the first error (``node_loss.get_all``); the
driver (``train.fit``) then abandons the whole architecture and builds it again on the nodes
alive, from the last checkpoint.
"""
from __future__ import annotations

import math
import os
import socket
import time

import numpy as np
import ray
import torch

from orchard.api import kill_and_confirm

from .worker_group import WorkerGroup

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
        self.pushes = 0
        self.pushed_names: list[list[str]] = []   # the names of the last few pushes (tests, docs)
        self._pending: dict[str, np.ndarray] | None = None
        self._since_push = 0
        self.weight_decay = 0.0

    def info(self) -> dict:
        return {"steps_per_epoch": self.group.steps_per_epoch, "plan": self.group.plan(),
                "num_params": int(sum(v.size for v in self.group.get_params().values())),
                "num_train": self.group.num_train, "num_test": len(next(iter(self.group.test.values()))),
                "node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}

    def get_params(self) -> dict:
        return self.group.get_params()

    def set_params(self, params: dict) -> None:
        self.group.set_params(params)

    def evaluate(self, pull: bool = False) -> dict:
        if pull and self.client is not None:
            self.group.set_params(self.client.pull())
        return self.group.evaluate()

    def first_non_finite(self) -> tuple[int, str, float] | None:
        return self.group.first_non_finite

    def stats(self) -> dict:
        return {**self.group.stats(), "comm_bytes": self.bytes, "comm_s": self.comm_s, "pushes": self.pushes,
                "pushed_names": self.pushed_names}

    # -- parameter servers -----------------------------------------------------------------------
    def connect_ps(self, ps_group, worker_index: int, weight_decay: float = 0.0) -> None:
        from orchard.api import PSClient

        self.client = PSClient(ps_group, worker_index)
        self.weight_decay = float(weight_decay)
        self.group.set_params(self.client.pull())

    def run_ps(self, steps: int, sample_ratio: float = 1.0) -> dict:
        """``steps`` iterations of compute; every ``sync_every``-th one pushes the accumulated
        gradients and pulls fresh parameters in one fused call (a random ``sample_ratio`` share
        of the parameters when it is < 1)."""
        from orchard.api import payload_bytes

        names = sorted(self.group.get_params())
        every = int(self.group.spec.get("push_every", 1) or 1)
        metrics = {}
        for _ in range(steps):
            metrics = self.group.compute()
            grads = self.group.server_gradients(self.weight_decay)
            self._pending = grads if self._pending is None else {n: self._pending[n] + g for n, g in grads.items()}
            self._since_push += 1
            self.group.advance()
            if self._since_push < every:
                continue
            grads, self._pending, self._since_push = self._pending, None, 0
            if sample_ratio < 1.0:
                keep = sample_names(names, sample_ratio, int(self.group.spec.get("sample_seed", 0)), self.rank,
                                    self.pushes)
                grads = {n: grads[n] for n in keep}
            self.pushed_names = (self.pushed_names + [sorted(grads)])[-8:]
            t0 = time.perf_counter()
            # Sampling relieves the servers both ways: only the pushed parameters come back.
            fresh = self.client.push_pull(grads, self.pushes, only_pushed=sample_ratio < 1.0)
            self.comm_s += time.perf_counter() - t0
            # What crossed the wire: our gradients up, the answering shards' parameters down.
            self.bytes += payload_bytes(grads) + payload_bytes(fresh)
            self.pushes += 1
            self.group.set_params(fresh)
        return metrics

    # -- all-reduce ------------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        """This node's IP (as Ray knows it) and a free port on it: the rendezvous of the
        all-reduce group, reachable from groups on other nodes."""
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return host, s.getsockname()[1]

    def join_allreduce(self, host: str, port: int) -> None:
        import torch.distributed as dist

        # gloo talks over the interface that carries this node's IP, not whatever the hostname
        # resolves to (often 127.0.1.1, unreachable from other machines).
        interface = _interface_of(ray.util.get_node_ip_address())
        if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
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
    whatever keys it sets; weight decay stays the app's unless it sets its own.  The spec's
    ``weight_decay`` is the rule's; ``Architecture`` hands it to the groups, which add it with
    each parameter's ``wd_mult``, and starts the servers with none."""
    if server_updater:
        keep = {"weight_decay": updater["weight_decay"]} if "weight_decay" in updater else {}
        updater = {**keep, **server_updater}
    spec = {"name": updater.get("name", "sgd"), "lr": float(updater.get("lr", 0.01)),
            "momentum": float(updater.get("momentum", 0.0)), "weight_decay": float(updater.get("weight_decay", 0.0))}
    if spec["name"] == "adam":
        spec["betas"] = (float(updater.get("beta1", 0.9)), float(updater.get("beta2", 0.999)))
    return spec


def sample_names(names: list[str], fraction: float, seed: int, group: int, push: int) -> list[str]:
    """Parameter sampling (6.5.1): a random ``fraction`` of ``names`` (at least one), drawn
    afresh for every push of every group from ``(seed, group, push)``: reproducible, and
    independent between groups and pushes."""
    if fraction >= 1.0:
        return list(names)
    k = max(1, math.ceil(len(names) * fraction))
    rng = np.random.default_rng([int(seed), int(group), int(push)])
    return [names[i] for i in sorted(rng.choice(len(names), size=k, replace=False))]


def _interface_of(ip: str) -> str | None:
    """The network interface that carries ``ip`` on this machine (None if none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


class Architecture:
    """Starts the groups (and servers) of one architecture and runs them in rounds of steps."""

    def __init__(self, arch: dict, spec: dict, cpus_per_group: float, start_bound_s: float | None = None):
        """``start_bound_s``: how long the groups may wait for their CPUs (a replacement node);
        then ``node_loss.NotPlaced`` says in one line what they needed."""
        from orchard.api import NotPlaced, get_all

        self.arch, self.spec = arch, spec
        self.name = arch["name"]
        self.num_groups = int(arch["worker_groups"])
        self.actors, self.ps_groups = [], []
        # the servers' rule and the weight decay the groups add themselves (server_optimizer)
        self.server_rule = server_optimizer(spec["updater"], arch.get("server_updater"))
        # SPREAD: on a cluster the groups land on different nodes (one node: no difference)
        opts = {"num_cpus": cpus_per_group, "scheduling_strategy": "SPREAD"}
        self.actors = [GroupActor.options(**opts).remote(spec, r, self.num_groups) for r in range(self.num_groups)]
        try:
            # the servers' processes start beside the groups' (one start, not two in a row);
            # they are filled with group 0's initial parameters once those exist (_start)
            self.ps_groups = self._servers(arch)
            self._start(arch, get_all([a.info.remote() for a in self.actors], start_bound_s))
        except ray.exceptions.GetTimeoutError:
            self.abandon()
            raise NotPlaced(f"singa: {self.num_groups} worker groups", {"CPU": cpus_per_group},
                            float(start_bound_s)) from None
        except BaseException:
            self.abandon()  # e.g. a group placed on a node dying meanwhile: none of it is left running
            raise

    def _start(self, arch: dict, infos: list[dict]) -> None:
        self.nodes = [i["node_id"] for i in infos]
        # the data each group saw: a strided 1/num_groups share of the training set; all test it
        self.data_partition = {"train_per_group": [i["num_train"] for i in infos], "test": infos[0]["num_test"]}
        self.rendezvous: tuple[str, int] | None = None
        self.steps_per_epoch = min(i["steps_per_epoch"] for i in infos)
        self.plan = infos[0]["plan"]
        self.num_params = infos[0]["num_params"]
        self.exchange_bytes = 0
        self.sample_ratio = float(arch.get("sample_ratio", 1.0) or 1.0)
        params = ray.get(self.actors[0].get_params.remote())
        if self.ps_groups:
            replicas = len(self.ps_groups)
            for group in self.ps_groups:
                group.initialize(params)
            ray.get([a.connect_ps.remote(self.ps_groups[g % replicas], _index_in(g, replicas),
                                         self.server_rule["weight_decay"])
                     for g, a in enumerate(self.actors)])
        elif self.name == "allreduce" and self.num_groups > 1:
            host, port = self.rendezvous = tuple(ray.get(self.actors[0].address.remote()))
            ray.get([a.join_allreduce.remote(host, port) for a in self.actors])
        else:
            ray.get([a.set_params.remote(params) for a in self.actors[1:]])

    def _servers(self, arch: dict) -> list:
        """The architecture's server groups, started empty: one per replica (``replicated``), one
        for ``sync_ps`` and ``async_ps``, none for the others."""
        if self.name not in ("sync_ps", "async_ps", "replicated"):
            return []
        from orchard.api import PSGroup

        replicas = int(arch.get("server_groups", 1)) if self.name == "replicated" else 1
        return [PSGroup.create(None, num_servers=int(arch["servers_per_group"]),
                               num_workers=len([g for g in range(self.num_groups) if g % replicas == r]),
                               mode=arch.get("mode", "sync"), optimizer=dict(self.server_rule, weight_decay=0.0),
                               cpus_per_server=float(arch.get("cpus_per_server", 0)),
                               async_average=bool(arch.get("async_average", False)))
                for r in range(replicas)]

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
        from orchard.api import get_all

        # the first error at once: after a lost node the groups left may wait for it forever
        metrics = get_all(refs)[0]
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

    def first_non_finite(self) -> tuple[int, str, float] | None:
        """The earliest ``(step, metric, value)`` of any group whose training loss went NaN or
        inf (steps counted from this machine's start), or None: one call per group, per round."""
        found = [tuple(f) for f in ray.get([a.first_non_finite.remote() for a in self.actors]) if f]
        return min(found) if found else None

    def params(self) -> dict:
        if self.ps_groups:
            from orchard.api import PSClient

            return PSClient(self.ps_groups[0], 0).pull()
        return ray.get(self.actors[0].get_params.remote())

    def stats(self) -> dict:
        per = ray.get([a.stats.remote() for a in self.actors])
        steps = max(1, per[0]["steps"])
        worker_bytes = sum(p["comm_bytes"] for p in per)
        return {"steps": per[0]["steps"], "compute_s": per[0]["compute_s"],
                "comm_s": per[0]["comm_s"], "pushes": per[0]["pushes"], "pushed_names": per[0]["pushed_names"],
                "comm_bytes_per_step": (worker_bytes + self.exchange_bytes) / steps,
                "bridge_bytes_per_step": sum(p["bridge_bytes"] for p in per) / steps,
                "group_param_bytes_per_step": sum(p["group_param_bytes"] for p in per) / steps}

    def abandon(self) -> None:
        """End every group and server without asking them for their state: some may be gone with
        a lost node, others stuck waiting for them (the architecture is rebuilt from a checkpoint)."""
        # the servers restart after a lost node: one may be mid-restart now, where a plain kill
        # can be ignored (kill_and_confirm); the groups never restart
        kill_and_confirm([*self.actors, *(s for g in self.ps_groups for s in g.servers)])

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
