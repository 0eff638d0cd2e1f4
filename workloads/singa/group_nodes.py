"""The nodes of a partitioned worker group as separate Ray actors (section 5.2, Appendix B).

A worker group with ``workers_per_group = K > 1`` splits its net over K nodes
(``partition.py``).  Here every node is a ``GroupNode`` actor that builds the same
``PartitionedNet`` and executes only the layers at its ``location``.  The bridge pairs are the
only way tensors cross between nodes, as in SINGA: a ``bridge_src`` delivers its feature into
the peer actor's mailbox (a fire-and-forget actor call), the ``bridge_dst`` there waits on its
mailbox; in the backward pass the gradient travels the other way.  A node is a threaded actor,
so a delivery lands while the node's own step is blocked waiting for another one.

Why peer-to-peer rather than a driver that walks the layer schedule: a feature crosses once
(node to node) instead of twice (node -> driver -> node), and every node works through the
same topological order on its own, so nodes compute in parallel wherever the plan lets them
(data-partitioned layers).  No deadlock is possible: a node blocks only on a bridge whose
source end comes earlier in the shared order (later, in the backward pass).

The group's process (``WorkerGroup``) keeps the master copy of the parameters in unpartitioned
names and the updater.  Each step it sends every node the values of the pieces it holds with
the step call, and takes the pieces' gradients back in the answer (``group/param_bytes``).
The batch goes to node 0, which holds the input, parser and loss layers.
"""
from __future__ import annotations

import threading

import numpy as np
import ray
import torch

from .layers.base import import_layer_modules
from .model import NeuralNet
from .partition import PartitionedNet

BRIDGE_TIMEOUT_S = 300.0


class Mailbox:
    """Tensors delivered by peers, keyed ``(call, bridge, "feature" | "grad")``."""

    def __init__(self):
        self._items: dict[tuple, object] = {}
        self._ready = threading.Condition()

    def put(self, key: tuple, value) -> None:
        with self._ready:
            self._items[key] = value
            self._ready.notify_all()

    def take(self, key: tuple, timeout_s: float):
        with self._ready:
            if not self._ready.wait_for(lambda: key in self._items, timeout_s):
                raise TimeoutError(f"bridge {key[1]}: no {key[2]} arrived within {timeout_s:.0f} s "
                                   f"(step call {key[0]}); did a peer node of the group fail?")
            return self._items.pop(key)


class BridgeTransport:
    """What a node's bridge layers send and receive through (``layer.transport``)."""

    def __init__(self, node: int, mailbox: Mailbox, timeout_s: float = BRIDGE_TIMEOUT_S):
        self.node, self.mailbox, self.timeout_s = node, mailbox, timeout_s
        self.peers: list = []
        self.call = 0
        self.bytes_sent = 0
        self.pending: list = []

    def send(self, peer: int, key: tuple, tensor: torch.Tensor | None) -> None:
        array = None if tensor is None else tensor.detach().contiguous().cpu().numpy()
        if array is not None:
            self.bytes_sent += array.nbytes
        self.pending.append(self.peers[peer].deliver.remote((self.call, *key), array))

    def receive(self, key: tuple) -> torch.Tensor | None:
        array = self.mailbox.take((self.call, *key), self.timeout_s)
        # np.array copies: arrays from the object store are read-only (GROUND.md)
        return None if array is None else torch.from_numpy(np.array(array))

    def flush(self) -> None:
        """Wait until this step's deliveries landed (and surface a failed one)."""
        ray.get(self.pending)
        self.pending.clear()


def build_net(recipe: dict) -> PartitionedNet:
    """The group's ``PartitionedNet`` from its recipe: every node builds the same one (after
    importing the user's layer modules: a node actor is a process of its own)."""
    import_layer_modules(recipe.get("layer_modules"))
    base = NeuralNet(recipe["layers"], recipe["input_shapes"], seed=recipe["seed"])
    return PartitionedNet(base, recipe["group_size"], recipe["plan"])


@ray.remote(num_cpus=0, max_concurrency=4)
class GroupNode:
    """Node ``node`` of a partitioned worker group: its layers, its parameter pieces, a mailbox.
    ``num_cpus=0``: the group's CPU reservation (its ``GroupActor``) covers its nodes."""

    def __init__(self, recipe: dict, node: int, threads: int = 1):
        torch.set_num_threads(threads)
        self.node = node
        self.net = build_net(recipe)
        mine = [layer for layer in self.net.layers if layer.location == node]
        here = {id(layer) for layer in mine}
        for layer in mine:
            for src in layer.src_layers:
                if id(src) not in here and layer.type != "bridge_dst":
                    raise RuntimeError(f"layer {layer.name} on node {node} reads {src.name} on node "
                                       f"{src.location} without a bridge")
        # The net now walks only this node's layers: forward, backward and CD as usual.
        self.net.layers = mine
        self.mailbox = Mailbox()
        self.transport = BridgeTransport(node, self.mailbox)
        for layer in mine:
            if layer.type in ("bridge_src", "bridge_dst"):
                layer.transport = self.transport

    def connect(self, peers: list) -> None:
        self.transport.peers = peers

    def pid(self) -> int:
        import os

        return os.getpid()

    def deliver(self, key: tuple, array) -> None:
        self.mailbox.put(key, array)

    def step(self, call: int, mode: str, batch: dict | None, params: dict[str, np.ndarray],
             cd_k: int = 1) -> dict:
        """One pass of ``mode`` (bp | cd | test) over this node's layers with fresh ``params``.
        Returns the local loss layers' metrics, this node's gradient pieces (bp, cd) and the
        bridge bytes it sent."""
        self.transport.call = call
        sent_before = self.transport.bytes_sent
        self.net.load_pieces(params)
        batch = {k: torch.as_tensor(np.array(v)) for k, v in batch.items()} if batch is not None else {}
        if mode == "bp":
            metrics = self.net.train_bp(batch)
        elif mode == "cd":
            metrics = self.net.train_cd(batch, cd_k)
        else:
            with torch.no_grad():
                metrics = self.net.forward(batch, "test")
        self.transport.flush()
        out = {"metrics": metrics, "bridge_bytes": self.transport.bytes_sent - sent_before}
        if mode != "test":
            out["grads"] = self.net.pieces(self.node, "grad")
        return out


class NodeGroup:
    """The group process's handle on its K node actors; ``net`` is the master copy of the
    parameters (a ``PartitionedNet`` that computes nothing itself)."""

    def __init__(self, net: PartitionedNet, recipe: dict, threads: int = 1):
        self.net = net
        self.size = net.group_size
        self.nodes = [GroupNode.remote(recipe, k, threads) for k in range(self.size)]
        ray.get([n.connect.remote(self.nodes) for n in self.nodes])
        self.calls = 0
        self.bridge_bytes = 0   # bridge traffic of training steps (node to node)
        self.param_bytes = 0    # parameter pieces out to the nodes + gradient pieces back

    def run(self, mode: str, batch: dict[str, torch.Tensor], cd_k: int = 1) -> dict[str, float]:
        """``mode`` bp | cd fills the master net's gradients; test only returns metrics."""
        self.calls += 1
        numpy_batch = {k: v.numpy() for k, v in batch.items()}
        params = [self.net.pieces(k) for k in range(self.size)]
        refs = [node.step.remote(self.calls, mode, numpy_batch if k == 0 else None, params[k], cd_k)
                for k, node in enumerate(self.nodes)]
        # Wait node by node so a failing node raises at once: its peers would otherwise sit on
        # their mailboxes until the bridge timeout.
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ray.get(ready)
        outs = ray.get(refs)
        metrics: dict[str, float] = {}
        for out in outs:
            metrics.update(out["metrics"])
        if mode != "test":
            for out in outs:
                self.net.load_pieces(out["grads"], "grad")
            self.bridge_bytes += sum(out["bridge_bytes"] for out in outs)
            self.param_bytes += sum(v.nbytes for p in params for v in p.values())
            self.param_bytes += sum(v.nbytes for out in outs for v in out["grads"].values())
        return metrics

    def close(self) -> None:
        for node in self.nodes:
            ray.kill(node)
        self.nodes = []
