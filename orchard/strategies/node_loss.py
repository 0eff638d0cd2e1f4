"""What a run records when a node of its cluster disappears, whatever the workload.

Ray recovers most of a lost node by itself (tasks are retried, objects rebuilt from their lineage,
actors with ``max_restarts`` come back elsewhere, Ray Train restarts the worker group from the
last checkpoint); orchard's part is to say it happened and what it cost, in the run's own MLflow
metrics:

    cluster/nodes_lost    nodes alive while the run trained that died (logged the moment the
                          GCS marks them dead, so a user sees it while the run recovers)
    cluster/nodes_joined  nodes that joined while the run trained (a replacement)
    train/restarts        times the training went back to its last checkpoint (a worker group
                          restarted, a forest round's lost share redone)
    train/lost_s          seconds from each loss until training went on (a restarted group
                          restored its checkpoint; for forest, the interrupted round finished),
                          summed over the losses

``NodeWatch`` is the driver's half: a thread that reads the GCS node table once a second.
``RecoveryLog`` is the workers' half: records in the GCS that Ray Train workers write when their
group started again and which epoch it restored (a Train worker cannot reach the driver's
memory), as the GCS outlives every node a run can lose (docs/cluster.md).
"""
from __future__ import annotations

import contextlib
import time

import ray

from orchard import background
from orchard.cluster import ray_private

POLL_S = 1.0  # how often the driver reads the node table; a loss is timed to within this


def _alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


class NodeWatch:
    """Nodes that die or join while the run trains, with the time each loss was seen.

    Use as a context manager around training (or ``start``/``stop`` where the watch outlives a
    block: the run's own, orchard/run/services.py); ``ctx`` (a RunContext, or None) gets
    ``cluster/nodes_lost`` / ``cluster/nodes_joined`` as they change. ``elastic``: an elastic
    Ray Train group trains meanwhile, so a node that joins is shown to Ray's autoscaling
    coordinator at once (``_refresh_node_view``): the group grows back at its next resize
    check, not up to 20 s later."""

    def __init__(self, ctx=None, poll_s: float = POLL_S, elastic: bool = False):
        self.ctx, self.poll_s, self.elastic = ctx, poll_s, elastic
        self.lost_at: list[float] = []   # time.time() of each loss, in order
        self.joined = 0
        self._known: set[str] = set()
        # a check that fails (the GCS busy, Ray stopping) is looked at again next time
        self._poller = background.Poller(self.check, poll_s, "orchard-node-watch")

    def start(self) -> "NodeWatch":
        self._known = _alive_nodes()
        self._poller.start()
        return self

    def stop(self) -> None:
        self._poller.stop(timeout_s=5 * self.poll_s)
        try:
            self.check()  # a loss in the last second of the run still counts
        except Exception:  # noqa: BLE001 - Ray stopping under an interrupt: what was seen stands
            pass

    def __enter__(self) -> "NodeWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def check(self) -> None:
        """Compare the node table with what was alive before; log what changed."""
        alive = _alive_nodes()
        gone, new = self._known - alive, alive - self._known
        if not gone and not new:
            return
        now = time.time()
        self.lost_at += [now] * len(gone)
        self.joined += len(new)
        self._known = alive
        if new and self.elastic:
            _refresh_node_view()
        if self.ctx is not None:
            self.ctx.log_metrics({"cluster/nodes_lost": len(self.lost_at), "cluster/nodes_joined": self.joined})

    @property
    def nodes_lost(self) -> int:
        return len(self.lost_at)

    def lost_s(self, went_on_at: list[float]) -> float:
        """Seconds from each loss until the first of ``went_on_at`` (times training went on)
        after it, summed; a loss after the last of them (training was over) cost none."""
        return sum(min(t for t in went_on_at if t >= lost) - lost
                   for lost in self.lost_at if any(t >= lost for t in went_on_at))


class StartBound:
    """The bound on a worker group's start that an *elastic* Ray Train group lacks.

    A fixed-size group that cannot get its resources fails after Ray's start timeout
    (``cluster.worker_start_timeout_s``); an elastic one waits without a bound until its minimum
    fits (Ray Train's controller stays INITIALIZING or RESTARTING). So when the controller has
    waited so for ``bound_s`` (RecoveryLog, told by ``ControllerStates``), the run's controller
    is ended and ``expired`` is set: the launcher says in one line what it needed.

    Killed, not aborted: a controller waiting for an elastic group's minimum decides again and
    again without yielding its event loop (Ray 2.60), so its ``abort`` never runs (seen here);
    no worker group exists then, so the controller is all there is to end. Only this run's
    controller: a sweep's trials share the driver's job."""

    def __init__(self, log, bound_s: float, poll_s: float = POLL_S):
        self.log, self.bound_s, self.poll_s = log, bound_s, poll_s
        self.expired = False
        self._poller = background.Poller(self._look, poll_s, "orchard-start-bound")

    def __enter__(self) -> "StartBound":
        self._poller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._poller.stop(timeout_s=5 * self.poll_s)

    def _look(self):
        since = self.log.waiting_since()   # the GCS busy: the poller looks again
        if since is not None and time.time() - since > self.bound_s:
            self.expired = True
            if self._end_controller():
                return background.Poller.DONE
        return None

    def _end_controller(self) -> bool:
        """Kill the run's controller; False while it has not told its id yet. The wait is counted
        from before the controller starts, and on a loaded machine its start alone outlasted a
        short bound: ending nothing then, and looking no more, left the controller it started
        spinning for good (a fresh-clone test run hung so)."""
        try:
            actor_id = self.log.controller_id()
        except Exception:  # noqa: BLE001 - the GCS busy: looked at again next time
            return False
        if not actor_id:
            return False
        try:
            ray.kill(ray_private.actor_handle(actor_id))
        except Exception:  # noqa: BLE001 - gone meanwhile: fit() returns on its own
            pass
        return True


# the controller states in which no group trains and Ray Train itself sets no bound on the wait
# (SCHEDULING, a placement group being filled, has Ray's start timeout)
WAITING_STATES = ("INITIALIZING", "RESTARTING", "RESCHEDULING")


def controller_states(log):
    """A Ray Train controller callback (internal API: ``ControllerCallback``) that tells ``log``
    each state the controller enters; None where this Ray has no such hook."""
    try:
        ControllerCallback = ray_private.train_controller_callback_class()
    except ImportError:
        return None

    class ControllerStates(ControllerCallback):
        def __init__(self, log):
            self.log = log

        def after_controller_start(self, train_run_context):
            with contextlib.suppress(Exception):  # the GCS busy: the driver's bound waits longer, no more
                self.log.controller(ray.get_runtime_context().get_actor_id())

        def after_controller_state_update(self, previous_state, current_state):
            name = getattr(getattr(current_state, "_state_type", None), "name", "")
            if name == getattr(getattr(previous_state, "_state_type", None), "name", ""):
                return
            with contextlib.suppress(Exception):  # never the controller's failure
                self.log.state(name, time.time())
            if name in ("RESTARTING", "RESCHEDULING"):
                _refresh_node_view()

    return ControllerStates(log)


def _refresh_node_view() -> None:
    """Make Ray's autoscaling coordinator look at the nodes again, now.

    An elastic group sizes itself from the coordinator's view of the nodes, which it refreshes
    every 20 s: right after a lost node that view still holds it, and Ray Train restarted two
    workers where one fits, then waited the whole start bound for a CPU that was gone (seen
    here). Called from the controller as it starts over: its calls reach the coordinator in
    order, so the size it asks for next is counted on the nodes alive."""
    try:
        ray_private.refresh_autoscaling_coordinator()
    except Exception:  # noqa: BLE001 - another Ray: the coordinator refreshes on its own
        pass


class RecoveryLog:
    """Where each Ray Train worker group, on rank 0, notes that it started and from which
    epoch (None: from the start), with the time; where the controller notes its state and actor
    id; read by the driver. Held in the GCS (``ray_private.ClusterNotes``), which every process
    of the run reaches and which outlives every node but the head: an actor for these few records
    was one more process to start per Train launch (~1.2 s of CPU, two in a video run). A driver
    killed outright leaves its launch's few hundred bytes there until the cluster stops."""

    def __init__(self):
        import uuid

        self.notes = ray_private.ClusterNotes(f"recovery/{uuid.uuid4().hex}/")
        # since when the controller waits for a group to start: from now, as no group runs yet
        # (Ray Train reports no transition into its first state, INITIALIZING)
        self.notes.put("waiting", time.time())

    def state(self, name: str, at: float) -> None:
        if name not in WAITING_STATES:
            self.notes.put("waiting", None)
        elif self.notes.get("waiting") is None:
            self.notes.put("waiting", at)

    def waiting_since(self) -> float | None:
        return self.notes.get("waiting")

    def controller(self, actor_id: str) -> None:
        self.notes.put("controller", actor_id)

    def controller_id(self) -> str | None:
        """The Train controller's actor id, to end it."""
        return self.notes.get("controller")

    def started(self, world_size: int, restored_epoch: int | None, at: float) -> int:
        """Note a group's start; how many groups started so far (this one included)."""
        n = len(self.notes.names("start/")) + 1
        record = {"world_size": world_size, "restored_epoch": restored_epoch, "at": at}
        while self.notes.put(f"start/{n:06d}", record, overwrite=False):  # taken: a start noted meanwhile
            n += 1
        return n

    def read(self) -> list[dict]:
        return [self.notes.get(name) for name in self.notes.names("start/")]

    def close(self) -> None:
        self.notes.clear()


def on_this_node() -> dict:
    """Options that keep an actor, a task or a Ray Data stage's tasks on this (the driver's) node,
    the one node a run cannot lose: for the actors whose state no checkpoint holds (a queue, a
    master, a cache) and the tasks that ask them. A label selector on the node id Ray gives every
    node (``ray.io/node-id``), a hard constraint like a node affinity that is not soft: it is a
    named parameter of ``.options`` and of ``Dataset.map_batches`` alike, where a scheduling
    strategy reaches Ray Data only through ``ray_remote_args``, deprecated in Ray 2.60 (a warning
    in every video run's log) and removed in 2.64."""
    try:
        here = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - a driver with no node of its own (Ray Client): Ray's choice
        return {}
    return {"label_selector": {"ray.io/node-id": here}}


def run_totals(ctx, metrics: dict[str, float]) -> dict[str, float]:
    """The run's figures over every Ray Train run it launched so far, ``metrics`` (one
    launch's) included: a run with several at once (video: one per stream) would otherwise log
    whichever ended last. Restarts add up; ``train/lost_s`` is the longest of them (streams
    recover side by side from one loss); nodes lost and joined are the most any one saw."""
    if ctx is None:
        return metrics
    seen = getattr(ctx, "_node_loss_totals", None)
    if seen is None:
        seen = {}
        try:
            ctx._node_loss_totals = seen
        except AttributeError:  # a context that takes no attributes: this launch's figures alone
            return metrics
    for key, value in metrics.items():
        seen[key] = seen.get(key, 0.0) + value if key == "train/restarts" else max(seen.get(key, 0.0), value)
    return dict(seen)


def train_metrics(watch: NodeWatch, starts: list[dict]) -> dict[str, float]:
    """The run's node-loss metrics from the watch and the worker groups' starts (RecoveryLog):
    a restart is every start after the first."""
    return {"cluster/nodes_lost": float(watch.nodes_lost), "cluster/nodes_joined": float(watch.joined),
            "train/restarts": float(max(len(starts) - 1, 0)),
            "train/lost_s": watch.lost_s([s["at"] for s in starts])}


# ---- workloads that place their own actors (singa's worker groups and servers) ----------------
class NotPlaced(RuntimeError):
    """Actors a workload places itself did not start within ``cluster.worker_start_timeout_s``:
    what they asked for and what the cluster has, in one line (as ``launch.WorkersDidNotStart``
    says it for Ray Train groups)."""

    def __init__(self, what: str, per_actor: dict, bound_s: float, nodes_lost: int = 0):
        super().__init__(did_not_start(what, per_actor, bound_s, nodes_lost))


def did_not_start(what: str, per_actor: dict, bound_s: float, nodes_lost: int = 0) -> str:
    """One line: ``what`` (each asking ``per_actor``) did not start within ``bound_s``, and what
    the cluster has free of each resource asked for (Ray Train groups and a workload's own actors)."""
    # after a lost node the bound is how long the run waited for a replacement
    lost = f" after losing {nodes_lost} node{'s' if nodes_lost != 1 else ''}" if nodes_lost else ""
    ask = ", ".join(f"{v:g} {k}" for k, v in per_actor.items())
    try:
        free, total = ray.available_resources(), ray.cluster_resources()
        have = ", ".join(f"{free.get(k, 0):g} of {total.get(k, 0):g} {k} free" for k in per_actor)
    except Exception:  # noqa: BLE001 - Ray already stopping: the request alone still says it
        have = "unknown"
    return (f"{what} ({ask} each) did not start{lost} within {bound_s:g} s "
            f"(cluster.worker_start_timeout_s); the cluster has {have}")


def start_bound_s(cfg: dict) -> float:
    """``cluster.worker_start_timeout_s`` (the job's environment carries it to Ray Train's
    controller; a workload's own actors read it from the config): how long a start may wait."""
    import os

    bound = (cfg.get("cluster") or {}).get("worker_start_timeout_s")
    return float(bound or os.environ.get("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60"))


def get_all(refs: list, timeout_s: float | None = None) -> list:
    """``ray.get(refs)`` that raises the first error as soon as it is there, not once every ref
    is: after a lost node the groups left may wait forever for a peer that is gone (a sync
    server's barrier, a gloo ring) while the lost one's ref already holds its error.
    ``timeout_s``: ``ray.exceptions.GetTimeoutError`` after that long."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending, out = list(refs), {}
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            raise ray.exceptions.GetTimeoutError(f"{len(pending)} of {len(refs)} calls not done in {timeout_s:g} s")
        out[ready[0]] = ray.get(ready[0])  # raises the call's error at once
    return [out[r] for r in refs]


# errors by which Ray says a process it ran is gone (its node, most often)
def _system_errors() -> tuple:
    ex = ray.exceptions
    return tuple(getattr(ex, n) for n in ("RayActorError", "ActorUnavailableError", "ObjectLostError",
                                          "OwnerDiedError", "NodeDiedError", "WorkerCrashedError",
                                          "LocalRayletDiedError") if hasattr(ex, n))


class Rebuilds:
    """For a workload that places its own actors (singa): whether a failure is a lost node it
    may rebuild after (``strategy.max_failures`` times), and the run's node-loss figures.

    A failure counts when Ray says a process is gone, or when a node was lost since the actors
    started (the groups left then fail their own way, e.g. a gloo ring whose peer vanished)."""

    def __init__(self, watch: NodeWatch, max_failures: int):
        self.watch, self.max_failures = watch, int(max_failures)
        self.restarts = 0
        self.went_on: list[float] = []   # each time a (re)built machine started training

    def started(self) -> int:
        """Note that training goes on now; the mark ``recoverable`` compares losses with."""
        self.went_on.append(time.time())
        return self.watch.nodes_lost

    def recoverable(self, exc: BaseException, mark: int, wait_s: float = 10.0) -> bool:
        """``exc`` is a lost node's doing and a rebuild is left: counts it."""
        if self.restarts >= self.max_failures:
            return False
        deadline = time.monotonic() + wait_s  # the GCS may mark the node dead a moment after
        while True:
            try:
                self.watch.check()
            except Exception:  # noqa: BLE001 - busy GCS: look again
                pass
            if self.watch.nodes_lost > mark:
                break
            if time.monotonic() > deadline:
                if not isinstance(exc, _system_errors()):
                    return False
                break
            time.sleep(0.5)
        self.restarts += 1
        return True

    def metrics(self) -> dict[str, float]:
        return {"cluster/nodes_lost": float(self.watch.nodes_lost), "cluster/nodes_joined": float(self.watch.joined),
                "train/restarts": float(self.restarts), "train/lost_s": self.watch.lost_s(self.went_on)}
