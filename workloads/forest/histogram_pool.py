"""The histogram actors of a run's rounds (phase 3's reducers, one per node partition).

Started when a batch first needs them and kept for the run; each node batch resets them. An
actor that died (its node lost, its process killed) in any phase is restarted by Ray
(``max_restarts``) or replaced here; the round runner then recomputes only its share of the
batch (train.py, ``RoundRunner._collect``), so a lost actor never loses a round.
"""
from __future__ import annotations

import ray

from orchard.api import kill_and_confirm

from .histogram_actor import HistogramActor
from .locality import on_node


class HistogramPool:
    """``actors[k]``: the reducer of node partition k. ``actor_cpus``: each one's CPU share;
    ``in_group``: inside a sweep trial's placement group (captured, default scheduling), else
    spread over the nodes; ``max_failures``: restarts of each before it is replaced.
    ``nodes``: where the data units live (locality.py), set by the round runner: actor k goes to
    nodes[k % len(nodes)] (soft), one per node in turn (left to SPREAD beside node-pinned tasks, a
    two-node run hung: its phase-2 tasks waited for CPUs on a node, most likely the one holding
    both actors, that never came free; with homes the actors also reserve no CPU, train.py)."""

    def __init__(self, actor_cpus: float, in_group: bool, max_failures: int):
        self.actor_cpus, self.in_group, self.max_failures = actor_cpus, in_group, max_failures
        self.actors: list = []
        self.nodes: list = []

    def node_of(self, k: int) -> str | None:
        """The node actor k is placed on (soft: a restarted actor may come back elsewhere, which
        only makes a parent's fetch cross nodes); None without homes."""
        return self.nodes[k % len(self.nodes)] if self.nodes and not self.in_group else None

    def _new(self, k: int):
        options = dict(num_cpus=self.actor_cpus, max_restarts=self.max_failures, max_task_retries=0)
        if self.node_of(k) is not None:
            options["scheduling_strategy"] = on_node(self.node_of(k))
        elif not self.in_group:
            options["scheduling_strategy"] = "SPREAD"  # node partitions on different machines
        return ray.remote(HistogramActor).options(**options).remote()

    def ensure(self, count: int) -> None:
        while len(self.actors) < count:
            self.actors.append(self._new(len(self.actors)))

    def reset(self, k: int, shape) -> bool:
        """Empty actor k's histograms for a new batch; an actor that died in an earlier phase
        (or is still restarting) gets time to come back, or is replaced. False: a parent of its
        derived nodes could not be fetched (HistogramActor.reset)."""
        for _ in range(self.max_failures + 2):
            try:
                return bool(ray.get(self.actors[k].reset.remote(*shape)))
            except ray.exceptions.RayError:  # RayActorError, ActorUnavailableError (restarting)
                self.revive(k)
        raise RuntimeError(f"histogram actor {k} failed {self.max_failures + 2} times")

    def send_resets(self, shapes: list) -> list:
        """Reset actors 0..len(shapes)-1 for a new batch, all at once, without waiting: an actor
        runs the calls of one caller in the order they were sent, so the slices the batch's
        phase-2 tasks send next are summed after the reset, and the tasks count while the actors
        allocate their histograms and fetch their parents. Returns the resets' refs (`confirm`)."""
        return [self.actors[k].reset.remote(*shape) for k, shape in enumerate(shapes)]

    @staticmethod
    def confirm(resets: list) -> bool:
        """After the batch's slices were acknowledged: False when some actor could not have a
        parent of its derived nodes (the batch is counted again, in full). An actor that died
        meanwhile is not judged here: its slices were not acknowledged, and the round runner
        revives it and recounts its share (train.py, ``RoundRunner._collect``). A reset that
        raised (``RayTaskError``) left its actor half reset: that is raised, never summed past."""
        fetched = True
        for ref in resets:
            try:
                fetched = bool(ray.get(ref)) and fetched
            except ray.exceptions.RayActorError:
                pass
        return fetched

    def revive(self, k: int) -> None:
        """After a failed call: wait for Ray to restart actor k, or replace it."""
        try:
            ray.get(self.actors[k].ping.remote(), timeout=60)
        except Exception:
            kill_and_confirm([self.actors[k]])  # restarting for a minute: a kill could miss it
            self.actors[k] = self._new(k)

    @staticmethod
    def acked(acks: list) -> bool:
        """Did every add of these reach a live actor that had its batch?"""
        try:
            return all(v >= 0 for v in ray.get(acks))
        except ray.exceptions.RayError:
            return False

    def shutdown(self) -> None:
        """Kill every actor and see it gone: one killed while Ray restarts it after a fault can
        outlive its kill and hold its CPU share (``kill_and_confirm``)."""
        kill_and_confirm(self.actors)
        self.actors = []
