"""Each workload at 1, 2, 4, ... workers and on 1, 2, 4 nodes with the same CPUs (issue 48).

    python -m bench scaling              # ~22-40 min on 2 idle cores (3 repeats)
    python -m bench scaling --smoke      # one repeat of the smallest sizes: checks it runs
    python -m bench scaling_forest_few   # the forest at 1, cores/4 and all cores, one node (a lent machine's call)
    python -m bench scaling_forest_paper # the forest's paper shape at cores/4 and all cores (the other call)
    python -m bench forest_actors        # the paper shape on all cores: an actor per worker vs a quarter of them

Every figure is one real ``python -m orchard workload=<name> ...`` run, attached to a
``ray.cluster_utils.Cluster`` on this machine (``cluster=remote``), the way a user runs on a
cluster: the worker sweep on one node holding all the cores, the node sweep on 1, 2, 4 nodes
that share the same cores between them (each node ``cores / nodes`` CPUs and its share of the
object store, so more nodes add object stores and the transfers between them, never CPUs).

What each row holds, per repeat:
- **the work's seconds**: the part of the run's time split (``time/split/<part>_s``, docs/runs.md)
  that scales with workers: flower's step loops (``steps``), the others' ``training``. Sizes:
``debug=smoke`` with a few more epochs, and the forest at issue 34's mid shape. The run's
  whole wall time stands beside it in the quality (fixed costs do not scale and are issue 49's).
- **speed-up and efficiency** against one worker (one node), from the medians.
- **effective parallelism**, seed 000's figure of merit (busy task and actor time over wall): for
  forest its own ``throughput/effective_parallelism`` (its tasks' and histogram actors' busy time
  over each round's wall, weighted by round); for every workload also the CPU-seconds the run's
  Ray task and actor processes (``ray::*``) used over the run's wall, read from the OS, the same
  measure for all four (``cpu parallelism``). The forest row's ``effective parallelism`` is the
  seed's, the others' the CPU figure. Beside it the CPU seconds themselves (``cpu s``) and the
  Ray processes the run started (``ray processes started``: beyond those the cluster held before
  it; a process costs CPU seconds to start before its first task does any work).
- **bytes between nodes**: what crossed the loopback interface during the run. The nodes of a
  ``cluster_utils.Cluster`` are processes on this machine, so objects between their stores and
  the gRPC between raylets travel over loopback; the one-node run's loopback bytes (control
  traffic only) stand beside it for the difference.

Fair: the same data, config and total CPUs in every row of a workload; each repeat starts each
cluster in turn (one at a time), runs the workloads on consecutive clusters in turns of direction
(so a workload's one-node and two-node runs are next to each other: ``cluster_order``) and, on one
node, goes round the worker counts, so a drift of the machine's speed lands on every side alike; one
untimed run per workload, on the bench's first cluster, fills the data caches and numba's compile
cache (kept by content, so a new cluster finds the kernels compiled). On a machine with more cores
the worker sweep goes on (1, 2, 4, ... up to the cores) and the node sweep to 4 nodes; run it there
with ``--out`` and keep the file as ``scaling_<cores>c.json``. Each run is kept the moment it ends
(bench/journal.py): a bench stopped by a lent machine's time limit still gives the rows of the runs
it finished (``python -m bench --from-runs``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench import journal
from bench.forest_vs_peers import ONE_MACHINE, SHAPES
from bench.machine import as_an_operator_would, busy_seconds
from orchard import background
from orchard.tracking.process_cpu import OwnCpu

REPO = Path(__file__).resolve().parents[1]

# each workload: the overrides over debug=smoke that give its workers something to share, the key
# that sets its workers, and the part of the time split that is its parallel work
WORKLOADS = {
    # forest at issue 34's mid shape (150k pixels x 1,000 offsets x 50 thresholds, depth 14, the
    # workload's full-size scenes: no debug=smoke): a round's work large against its fixed cost. At
    # smoke size (about 1 s of training) a second node's per-round cost was the whole figure. The
    # workload's own partitions, not the forest bench's one-machine ones (ONE_MACHINE: one data
    # unit, 8.2 s on one node here): one data unit is home to one node only, and two nodes took
    # 1.27x, 1.2-2.3 GB crossing between them (2026-11-28 00:20, the note in docs/scaling.md)
    "forest": {"smoke": False, "overrides": [o for o in SHAPES["mid"] if o not in ONE_MACHINE],
               "workers": "strategy.num_workers", "work": "training"},
    # the paper shape (bench scaling_forest_paper, a lent 16-core machine's call): the mid shape's
    # rounds keep ~7 s of its ~20 s from dividing with the workers on 16 cores (docs/scaling.md,
    # "What 12 at 16 workers asks of a shape"), which caps its effective parallelism near 3 at any
    # count; here a round's work is ~5x the mid shape's against the same per-round costs
    "forest paper": {"workload": "forest", "smoke": False,
                     "overrides": [o for o in SHAPES["paper"] if o not in ONE_MACHINE],
                     "workers": "strategy.num_workers", "work": "training"},
    # the same with a quarter of the histogram actors (bench forest_actors): fewer process starts
    # and slice calls against phase 3 on fewer actors, each searching on several threads. Its runs
    # share the default's folder (`data_of`): the same data, cached there, so it needs no untimed
    # run of its own, ~45 s of a lent machine's 15 minutes
    "forest paper, a quarter of the actors": {
        "workload": "forest", "smoke": False, "data_of": "forest paper",
        "overrides": [*(o for o in SHAPES["paper"] if o not in ONE_MACHINE), "forest.actors_per_worker=0.25"],
        "workers": "strategy.num_workers", "work": "training"},
    "flower": {"overrides": ["flower.epochs=6"], "workers": "strategy.num_workers", "work": "steps",
               "strategy": "ring"},
    # the thesis's other strategy: one parameter server (cpus_per_server 0: it shares the workers' cores)
    "flower ps": {"workload": "flower", "overrides": ["flower.epochs=6"], "workers": "strategy.num_workers",
                  "work": "steps", "strategy": "ps"},
    "singa": {"overrides": ["singa.epochs=4", "singa.tsne=false"], "workers": "strategy.num_workers",
              "work": "training"},
    # the seed's elastic decoders: the decode pool's size (an int: min = max, the pool does not grow on its own)
    "video": {"overrides": ["video.epochs=2"], "workers": "video.decode_concurrency", "work": "training"},
}
PAPER = ("forest paper", "forest paper, a quarter of the actors")  # the sizes' own, not the full sweep's
SIZES = {"full": {"workloads": [w for w in WORKLOADS if w not in PAPER], "smoke_sizes": False},
         # the forest alone (bench scaling_forest): what fits a lent 16-core machine's minutes
         "forest": {"workloads": ["forest"], "smoke_sizes": False},
         # the workloads whose steps wait on parameter servers (bench scaling_ps): re-measured alone
         # when the servers' wire changes, beside scaling.json's rows from before
         "ps": {"workloads": ["flower ps", "singa"], "smoke_sizes": False},
         # the forest at 1, cores/4 and all the cores, one node (bench scaling_forest_few): the
         # worker sweep in one 10-minute call on a lent 16-core machine, where a run takes ~40 s
         # and the whole forest size's 24 runs did not fit (docs/scaling.md, 2026-11-28)
         "forest_few": {"workloads": ["forest"], "smoke_sizes": False, "workers": "few", "nodes": [1]},
         # the forest at the paper shape at a quarter of the cores and all of them, one node (bench
         # scaling_forest_paper): a one-worker run of it takes minutes on 16 cores, so its rows
         # compare all the cores with a quarter of them; effective parallelism needs no baseline
         "forest_paper": {"workloads": ["forest paper"], "smoke_sizes": False, "workers": "quarter", "nodes": [1]},
         # the paper shape on all the cores with one actor per worker and with a quarter of them
         # (bench forest_actors): one row, the second against the first; 16 workers' actors cost
         # ~25 CPU-s of starts and calls on 2 cores told 16 CPUs (docs/scaling.md, "Fewer actors
         # than workers"), their phase 3 is the other side
         "forest_actors": {"workloads": list(PAPER), "smoke_sizes": False, "workers": "all", "nodes": [1],
                           "versus": True},
         "smoke": {"workloads": [w for w in WORKLOADS if w not in PAPER], "smoke_sizes": True}}
ESTIMATE = "~22-40 min on 2 idle cores (3 repeats: 22 min on 2026-12-03; this VM runs the same work up to 1.9x slower on some days)"
# one run's limit: every run of the sizes above takes 10-60 s here; a video run attached to a
# 2-CPU cluster after a flower run on it hung with its decoders idle (docs/scaling.md, "Measured")
RUN_LIMIT_S = 600


# the forest's rounds by phase (workloads/forest/run.py, phase_seconds) and its busy seconds by
# who was busy: where a worker count's time went, beside its wall time (on 16 cores: which phase
# stops dividing)
PHASES = {"bin_cache_s": "bin cache s", "phase1_s": "phase 1 s", "phase2_s": "phase 2 s", "phase3_s": "phase 3 s",
          "phase4_s": "phase 4 s", "between_phases_s": "between phases s",
          # the busy seconds behind the effective parallelism: tasks' and actors' (on 16 cores they
          # tripled from 4 workers to 16, 2026-12-04), and the phase-2 tasks that ran
          "task_busy_s": "task busy s", "actor_busy_s": "actor busy s", "phase2_tasks": "phase-2 tasks",
          # the driver's CPU over the rounds: the serial share that does not divide (its calls per
          # task and per actor grow with the workers; near the training wall, the driver is the limit)
          "driver_cpu_s": "driver cpu s",
          # the processes they ran in: more than the workers when Ray replaced idle ones (each new
          # one starts and loads the kernels again; 37 for 16 workers before 2026-12-04)
          "task_processes": "task processes"}
# the run's own processes, read from the OS: the CPU seconds they used (cpu parallelism x run
# wall), and how many started during the run. A forest worker process costs ~2 CPU-s before its
# first task (docs/scaling.md, 2026-12-04), so starts are a figure of their own
RUN_CPU = {"cpu_s": "cpu s", "processes_started": "ray processes started"}


class RayProcessCpu(OwnCpu):
    """CPU seconds of every Ray task and actor process on this machine (``ray::*`` titles), each
    counted from when it was first seen: the bench runs alone, so they are the run's."""

    def __init__(self):
        super().__init__(psutil.Process())
        for p in self.members():  # what ran before the run is not the run's
            try:
                t = p.cpu_times()
                self.seen[(p.pid, p.create_time())] = [p, t.user + t.system]
            except psutil.Error:
                pass
        self.before = set(self.seen)
        # kept apart from `seen`, which forgets a process once it exits: a run's task and actor
        # processes all exit with its job, and the count read after the run was always 0
        self.first_seen: set[tuple[int, float]] = set()

    def sample(self) -> float:
        total = super().sample()
        self.first_seen |= set(self.seen) - self.before
        return total

    def started(self) -> list[int]:
        """The pids of the processes first seen after this tracker was made, exited or not (one
        that lived less than a sample's interval is missed)."""
        return sorted(pid for pid, _ in self.first_seen)

    def members(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if cmd and cmd[0].startswith("ray::"):
                out.append(p)
        return out


def loopback_bytes() -> int:
    counters = psutil.net_io_counters(pernic=True).get("lo")
    return counters.bytes_sent if counters else 0


def start_cluster(nodes: int, cpus: int):
    """A ``cluster_utils.Cluster`` of ``nodes`` nodes sharing ``cpus`` CPUs and one node's object
    store (ray.init's 30% of available memory) between them."""
    from ray.cluster_utils import Cluster

    store = int(psutil.virtual_memory().available * 0.3) // nodes
    per = [cpus // nodes + (1 if i < cpus % nodes else 0) for i in range(nodes)]
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": per[0], "object_store_memory": store})
    for n in per[1:]:
        cluster.add_node(num_cpus=n, object_store_memory=store)
    cluster.wait_for_nodes()
    return cluster


def run_overrides(workload: str, smoke_sizes: bool = False) -> list[str]:
    """The orchard overrides of ``workload``'s runs (a label of ``WORKLOADS``), but its workers."""
    spec = WORKLOADS[workload]
    sizes = ["debug=smoke"] if smoke_sizes else [*(["debug=smoke"] if spec.get("smoke", True) else []), *spec["overrides"]]
    return [f"workload={spec.get('workload', workload)}", *sizes,
            *([f"strategy={spec['strategy']}"] if "strategy" in spec else [])]


def one_run(workload: str, workers: int, address: str, folder: Path, smoke_sizes: bool) -> dict:
    """One orchard run attached to the cluster at ``address``; its work seconds, wall, parallelism
    and loopback bytes. Raises with the run's last line if it fails."""
    from mlflow.tracking import MlflowClient

    spec = WORKLOADS[workload]
    uri = f"sqlite:///{folder}/mlflow.db"
    cmd = [sys.executable, "-m", "orchard", *run_overrides(workload, smoke_sizes),
           f"{spec['workers']}={workers}", "cluster=remote", f"cluster.address={address}",
           f"tracking.uri={uri}", f"output_dir={folder}/outputs", "progress=never"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env.pop("RAY_ADDRESS", None)
    # the run's Ray processes, and the bench's whole process tree (the cluster, the driver, their
    # workers) from this moment on: beside the machine's busy seconds, what others took meanwhile
    cpu, tree = RayProcessCpu(), OwnCpu(psutil.Process())
    tree0 = tree.sample()

    def sample() -> float:
        tree.sample()
        return cpu.sample()

    # often: what a process used after its last sample is lost when it exits
    sampler = background.Poller(sample, 0.5, "bench-ray-cpu")
    lo, machine0, t0 = loopback_bytes(), busy_seconds(), time.perf_counter()
    sampler.start()
    try:
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, check=False,
                              timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:  # a hung run is its workload's failed row, not a bench that never ends
        raise RuntimeError(f"{workload} at {workers} workers did not finish in {RUN_LIMIT_S} s") from None
    finally:
        wall = time.perf_counter() - t0
        sampler.stop(timeout_s=60)
    busy, lo_bytes, machine, own = cpu.sample(), loopback_bytes() - lo, busy_seconds() - machine0, tree.sample() - tree0
    if done.returncode != 0:
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        raise RuntimeError(f"{workload} at {workers} workers exited {done.returncode}: {lines[-1] if lines else ''}")
    client = MlflowClient(uri)
    run = client.search_runs([e.experiment_id for e in client.search_experiments()],
                             order_by=["attributes.start_time DESC"], max_results=1)[0]
    m = run.data.metrics
    work = m.get(f"time/split/{spec['work']}_s")
    if work is None:
        raise RuntimeError(f"{workload}: the run logged no time/split/{spec['work']}_s")
    out = {"work_s": work, "wall_s": wall, "total_s": m.get("time/total_s"), "cpu_parallelism": busy / wall,
           "cpu_s": busy, "processes_started": len(cpu.started()), "loopback_bytes": lo_bytes,
           # the machine's busy seconds over the run and the bench's own: their difference is what
           # others took, the load of a results file rebuilt from a journal (bench/journal.py)
           "machine_cpu_s": machine, "bench_cpu_s": own}
    if "throughput/effective_parallelism" in m:  # forest: the seed's own figure
        out["effective_parallelism"] = m["throughput/effective_parallelism"]
    # flower: what its steps waited on and moved; forest: its rounds' seconds by phase
    for key in ("time/comm_wait_s", "wire/bytes_per_step", *(f"train/{p}" for p in PHASES)):
        if key in m:
            out[key.split("/")[1]] = m[key]
    return out


def counts(cores: int, start: int = 1) -> list[int]:
    """1, 2, 4, ... up to ``cores`` (and ``cores`` itself when it is not a power of two)."""
    out, n = [], start
    while n <= cores:
        out.append(n)
        n *= 2
    return out if out[-1] == cores else [*out, cores]


def worker_counts(cores: int, which: str = "doubling") -> list[int]:
    """The worker counts of a size: ``doubling`` (1, 2, 4, ... up to the cores), ``few``
    (1, a quarter of the cores, all of them), ``quarter`` (a quarter of the cores and all) or
    ``all`` (the cores alone)."""
    if which == "all":
        return [cores]
    if which == "quarter":
        return sorted({max(1, cores // 4), cores})
    return sorted({1, max(1, cores // 4), cores}) if which == "few" else counts(cores)


def median(values: list[float]) -> float:
    import statistics

    return float(statistics.median(values))


def figures(runs: list[dict], workers: int, nodes: int, base: list[dict], base_workers: int) -> dict:
    """One side's quality: workers, nodes, effective parallelism, speed-up and efficiency against ``base``."""
    work = median([r["work_s"] for r in runs])
    speedup = median([r["work_s"] for r in base]) / work if work else float("nan")
    cpu_par = median([r["cpu_parallelism"] for r in runs])
    own = [r["effective_parallelism"] for r in runs if "effective_parallelism" in r]
    return {"workers": workers, "nodes": nodes,
            "effective parallelism": median(own) if own else cpu_par, "cpu parallelism": cpu_par,
            "speed-up": speedup, "efficiency": speedup * base_workers / workers,
            "run wall s": median([r["wall_s"] for r in runs]),
            "loopback MB": median([r["loopback_bytes"] for r in runs]) / 1e6,
            **{name: median([r[key] for r in runs]) for key, name in
               (("comm_wait_s", "network wait s"), ("bytes_per_step", "bytes per step"), *RUN_CPU.items(),
                *PHASES.items())
               if key in runs[-1]}}


def plan(size: dict, cores: int) -> tuple[list[int], list[int]]:
    """A size's worker counts (on one node) and node counts on a machine of ``cores``."""
    nodes = [n for n in size.get("nodes", (1, 2, 4)) if n <= cores]
    return worker_counts(cores, size.get("workers", "doubling")), nodes


def measure(size: dict, repeats: int) -> list[dict]:
    cores = os.cpu_count() or 1
    # the nodes start as a cluster's operator starts them (docs/cluster.md): numba's cache folder
    # named, idle workers kept a minute. Until 2026-12-06 they kept Ray's second: the 16-core
    # file of 2026-12-04 was measured so (docs/scaling.md, "forest on 16 cores: the bench's file")
    as_an_operator_would()
    sweep_counts, node_counts = plan(size, cores)
    results: dict[tuple, list[dict]] = {}
    failed: dict[str, str] = {}  # workload -> why: a run that fails is its workload's rows, not the end of the bench
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as name:
        tmp = Path(name)
        # each repeat starts every cluster in turn, one at a time, and runs every workload on it:
        # a workload's one- and two-node runs alternate, so a drift of the machine's speed over the
        # bench lands on both sides alike instead of in their ratio (it once ran every one-node
        # run first). Never two clusters at once: with two on one machine, Ray Train's
        # PlacementGroupCleaner (which asks the state API whether its run's controller lives, by
        # "auto" address) connected to the newer one, whose answer is about another cluster.
        for _ in range(repeats):
            for i, nodes in enumerate(node_counts):
                cluster = start_cluster(nodes, cores)
                try:
                    order = cluster_order(size["workloads"], i, len(node_counts))
                    for workload in [w for w in order if w not in failed]:
                        # it goes into a sqlite URI; a workload of another's data runs in its folder
                        folder = tmp / WORKLOADS[workload].get("data_of", workload).replace(" ", "_")
                        first = not folder.exists()
                        folder.mkdir(exist_ok=True)
                        try:
                            if first:
                                # untimed, once per workload: its data caches filled, the machine's
                                # page cache through its imports, numba's kernels compiled. Once is
                                # enough since the kernels are cached by content in the folder named
                                # above (workloads/forest/jit.py): a mid forest on a fresh cluster
                                # took 27.0 s, then 15.6 s, when every new cluster compiled them
                                # again; with the cache its first run on a new two-node cluster
                                # took 16.3 s, then 16.5 s (2026-12-03). It was one warm-up per
                                # workload on every cluster start: 30 runs, ~40% of the bench.
                                one_run(workload, cores, cluster.address, folder, size["smoke_sizes"])
                            # one node: the worker sweep; more nodes: all the cores' workers, spread over them
                            for workers in sweep_counts if nodes == 1 else [cores]:
                                r = one_run(workload, workers, cluster.address, folder, size["smoke_sizes"])
                                results.setdefault((workload, workers, nodes), []).append(r)
                                # kept the moment it ends: a bench stopped later still has it
                                journal.add({"workload": workload, "workers": workers, "nodes": nodes}, r)
                                print(f"  scaling: {workload} {workers} workers, {nodes} node(s): "
                                      f"{ {k: round(v, 2) for k, v in r.items()} }", flush=True)
                        except RuntimeError as exc:
                            failed[workload] = f"failed on {nodes} node(s): {str(exc)[:200]}"
                            journal.add({"workload": workload, "nodes": nodes}, failed=failed[workload])
                            print(f"  scaling: {workload}: {failed[workload]}", flush=True)
                finally:
                    cluster.shutdown()
    return assemble(size, cores, results, failed)


def cluster_order(workloads: list, i: int, clusters: int) -> list:
    """The order in which cluster ``i`` of a repeat's ``clusters`` runs the workloads: with several,
    the first last to first, the next first to last, and so on, so that a workload's runs on two
    consecutive clusters are next to each other in time (the first workload's, the forest's, a
    cluster's restart apart, with all the cores' workers last on one node and first on two). In
    one order on every cluster, the forest's one-node runs came ~5 minutes of other workloads
    before its two-node ones, and the issue-48 bound, read by the scale-out check as the slowest
    repeat of one side over the fastest of the other, took that gap's drift of the machine
    (1.36x on 2026-12-06 afternoon; 1.18x that evening, in turns: docs/scaling.md, "The rows
    re-measured (2026-12-06, evening)")."""
    return list(workloads)[::-1] if clusters > 1 and i % 2 == 0 else list(workloads)


def rows_from_runs(size: dict, cores: int, runs: list[dict]) -> list[dict]:
    """The rows of the runs a journal kept (bench/journal.py) on a machine of ``cores``: a bench
    stopped part-way has the rows its runs make, and says which it has not."""
    results: dict[tuple, list[dict]] = {}
    failed: dict[str, str] = {}
    for entry in runs:
        key = entry["key"]
        if "failed" in entry:
            failed[key["workload"]] = entry["failed"]
        else:
            results.setdefault((key["workload"], key["workers"], key["nodes"]), []).append(entry["run"])
    return assemble(size, cores, results, failed)


def assemble(size: dict, cores: int, results: dict[tuple, list[dict]], failed: dict[str, str]) -> list[dict]:
    """The rows of a size's runs, ``results[(workload, workers, nodes)]`` one dict per repeat. A
    row whose runs are missing (a bench stopped before them) says so in its status."""
    from bench.rows import row

    sweep_counts, node_counts = plan(size, cores)

    def compared(name: str, side_key: tuple, base_key: tuple, labels: tuple[str, str], workload: str,
                 side_at: tuple[int, int], base_at: tuple[int, int], note: str) -> dict:
        side, base = results.get(side_key, []), results.get(base_key, [])
        if not side or not base:
            return row(name, "s", [], [], orchard_label=labels[0], peer_label=labels[1], higher_is_better=False,
                       status="not measured: the bench stopped before "
                              + ("either side's runs" if not side and not base else "this side's runs" if not side
                                 else "its baseline's runs"))
        return row(name, "s", [r["work_s"] for r in side], [r["work_s"] for r in base], higher_is_better=False,
                   orchard_label=labels[0], peer_label=labels[1],
                   quality={"orchard": figures(side, *side_at, base, base_at[0]),
                            "peer": figures(base, *base_at, base, base_at[0])},
                   note=f"work: time/split/{WORKLOADS[workload]['work']}_s" + note)

    rows = []
    for workload in size["workloads"]:
        if workload in failed:
            rows.append(row(f"{workload}: workers and nodes", "s", [], [], orchard_label="orchard",
                            peer_label="orchard, 1 worker", higher_is_better=False, status=failed[workload]))
            continue
        base = sweep_counts[0]  # 1, or a quarter of the cores (size "quarter")
        base_label = "1 worker" if base == 1 else f"{base} workers"
        for workers in sweep_counts[1:]:
            rows.append(compared(f"{workload}: {workers} workers vs {base_label}", (workload, workers, 1),
                                 (workload, base, 1), (f"orchard, {workers} workers", f"orchard, {base_label}"),
                                 workload, (workers, 1), (base, 1), ""))
        for nodes in node_counts[1:]:
            rows.append(compared(f"{workload}: {nodes} nodes vs one node (same {cores} CPUs)", (workload, cores, nodes),
                                 (workload, cores, 1), (f"orchard, {cores} workers on {nodes} nodes",
                                                        f"orchard, {cores} workers on one node"),
                                 workload, (cores, nodes), (cores, 1),
                                 "; loopback MB: what crossed between the nodes' processes (the one-node figure "
                                 "is control traffic)"))
    if size.get("versus") and not failed:
        # two configurations of one workload on all the cores: the second's row, the first its peer
        first, second = size["workloads"]
        rows.append(compared(f"{second} vs {first}: {cores} workers", (second, cores, 1), (first, cores, 1),
                             (f"{second}, {cores} workers", f"{first}, {cores} workers"), second,
                             (cores, 1), (cores, 1), ""))
    return rows
