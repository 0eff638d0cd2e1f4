"""A parameter server's push and pull, in pieces Ray carries inside the call vs one array through
the object stores, on one node and across two (issue 48, Must-have 3).

    python -m bench ps_wire              # ~2 min on 2 idle cores (3 repeats)

One ``PSGroup`` of one server and one worker actor that calls ``PSClient.push_pull`` with a
flower-sized gradient (150,000 float32: 0.6 MB each way) as its Ray Train worker does every step,
on a ``ray.cluster_utils.Cluster`` of two 1-CPU nodes: the worker on the server's node, then on
the other node. orchard's side is the shipped wire (``wire_pieces``: pieces of 96 kB, inline in the
call and its reply); the peer is the same client and server with pieces switched off
(``INLINE_MAX_BYTES = 0``: one array each way through the worker's and the server's object
stores, what orchard sent before). Both sides run in the same worker process, alternating, on
the same gradient and server; the figure is the mean milliseconds of a round trip over
``steps`` calls after ``warmup`` untimed ones. sync mode with one worker: every call applies
the update, as a step of one worker does.
"""
from __future__ import annotations

import time

SIZES = {"full": {"params": 150_000, "steps": 200, "warmup": 20},
         "smoke": {"params": 150_000, "steps": 20, "warmup": 2}}
ESTIMATE = "~2 min on 2 idle cores (3 repeats)"


def _worker_class():
    import ray

    @ray.remote(num_cpus=1)
    class Pusher:
        """Calls push_pull as a Train worker does; ``pieces`` False: one array each way."""

        def round_trip_ms(self, group, params: int, steps: int, warmup: int, pieces: bool) -> float:
            import numpy as np

            from orchard.strategies import ps

            ps.INLINE_MAX_BYTES = 8 << 20 if pieces else 0  # this process's client; the server answers
            client = ps.PSClient(group, 0)                  # in as many pieces as it is asked for
            grads = {"w": np.random.default_rng(0).normal(size=params).astype(np.float32)}
            for step in range(warmup):
                client.push_pull(grads, step)
            start = time.perf_counter()
            for step in range(warmup, warmup + steps):
                client.push_pull(grads, step)
            return (time.perf_counter() - start) / steps * 1e3

    return Pusher


def measure(size: dict, repeats: int) -> list[dict]:
    import numpy as np
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from bench.rows import row
    from orchard.strategies.ps import ParameterServer, PSGroup, wire_pieces

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 1, "object_store_memory": 200 << 20})
    cluster.add_node(num_cpus=1, object_store_memory=200 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        on = lambda node: NodeAffinitySchedulingStrategy(node, soft=False)  # noqa: E731
        server_node = nodes[0]  # the shard pinned to the first node, the worker beside it or not
        server = ParameterServer.options(num_cpus=0, scheduling_strategy=on(server_node)).remote(
            1, "sync", {"name": "sgd", "lr": 1e-3})
        group = PSGroup([server], num_workers=1, mode="sync")
        group.initialize({"w": np.zeros(size["params"], np.float32)})
        Pusher = _worker_class()
        rows = []
        for where, node in (("one node", server_node), ("two nodes", next(n for n in nodes if n != server_node))):
            pusher = Pusher.options(scheduling_strategy=on(node)).remote()
            values: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(repeats):
                for pieces in (True, False):  # alternate: a change of load hits both alike
                    values[pieces].append(ray.get(pusher.round_trip_ms.remote(
                        group, size["params"], size["steps"], size["warmup"], pieces)))
            ray.kill(pusher)
            mb = size["params"] * 4 / 1e6
            rows.append(row(f"ps push+pull of {mb:.1f} MB, worker and server on {where}", "ms",
                            values[True], values[False], higher_is_better=False,
                            orchard_label=f"orchard, {wire_pieces(size['params'])} pieces inline",
                            peer_label="one array through the object stores",
                            note=f"mean of {size['steps']} round trips after {size['warmup']} untimed; "
                                 "sync mode, one worker"))
        return rows
    finally:
        ray.shutdown()
        cluster.shutdown()
