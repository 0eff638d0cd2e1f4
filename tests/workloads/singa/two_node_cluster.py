"""Run by test_worker_group.py in its own process (it needs a Ray of its own): the user's
layers train under sync_ps and allreduce on one node, then on a two-node
``ray.cluster_utils.Cluster`` with one worker group per node; prints the results as JSON."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import ray
import yaml
from ray.cluster_utils import Cluster

from workloads.singa.architectures import Architecture

NET = yaml.safe_load((Path(__file__).resolve().parents[2] / "fixtures" / "user_layers" / "user_mlp.yaml").read_text())


def spec() -> dict:
    return {"layers": NET["layers"], "algorithm": "bp", "data": "digits", "data_dir": None, "seed": 0, "smoke": True,
            "batch_size": 20, "shuffle": False, "augment": None, "group_size": 1, "partition": "none", "threads": 1,
            "updater": NET["train"]["updater"], "layer_modules": ["singa_user_layers"]}


def arch(name: str) -> dict:
    servers = 0 if name == "allreduce" else 1
    return {"name": name, "worker_groups": 2, "workers_per_group": 1, "server_groups": servers,
            "servers_per_group": servers, "mode": "sync", "sync_every": 1, "sample_ratio": 1.0}


def train(name: str, steps: int = 6) -> dict:
    machine = Architecture(arch(name), spec(), 0.5)
    try:
        machine.run_steps(steps)
        params = machine.params()
        accuracy = machine.evaluate()["loss/accuracy"]
        nodes, rendezvous = machine.nodes, machine.rendezvous
        ips = ray.get([a.info.remote() for a in machine.actors])
    finally:
        machine.shutdown()
    return {"params": {k: v.tolist() for k, v in params.items()}, "accuracy": accuracy, "nodes": nodes,
            "rendezvous": rendezvous, "node_ips": [i["node_ip"] for i in ips]}


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address, logging_level=logging.WARNING)
    try:
        out = {"one_node": {n: train(n) for n in ("sync_ps", "allreduce")}}
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        out["two_nodes"] = {n: train(n) for n in ("sync_ps", "allreduce")}
        out["cluster_nodes"] = len([n for n in ray.nodes() if n["Alive"]])
    finally:
        ray.shutdown()
        cluster.shutdown()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
