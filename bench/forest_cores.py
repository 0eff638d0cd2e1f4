"""The forest's phase-2 counting in N plain processes, no Ray: what a machine's cores give the
forest's work before orchard takes any share of it (issue 48).

    python -m bench forest_cores     # ~1 min on 2 idle cores; ~1-2 min on 16 (a guess)

Why: on the lent 16-core machine the forest's 16 workers took longer than 4 (scaling_16c.json,
2026-12-04): the tasks' and actors' busy seconds tripled from 4 workers to 16, the same work.
Either the machine's cores do not give 16 processes 16x (shared physical cores, memory
bandwidth, a CPU quota) or orchard's tasks slow each other in ways a plain process would not.
This bench tells the two apart on whatever machine it runs on.

What is run, at N = 1, a quarter of the machine's cores and all of them: N processes (spawned, one numba
thread each, as orchard's phase-2 tasks run: `forest.cpus_per_worker` 1) wait at a barrier, then
each runs the same fixed work; the wall time from the barrier to the last one done is timed.
Weak scaling: each process has the same work at every N, so the machine's speed-up for that
work is N x t(1) / t(N) (ideal N) and its efficiency t(1) / t(N) (ideal 1, the row's ratio).
Three kinds of work:
- **phase-2 counting, sparse and dense**: what `round_tasks.phase2_task` computes for one data
  partition and one feature partition once its examples are associated, without Ray
  (`round_tasks.count_slices`, the slices of two receiving actors), counted both ways: straight
  into the sparse slices, as orchard counts at this shape (sparse_counts.py), and in a dense
  histogram (zeroed, `accumulate_bins`, encoded by `encode_partial`), as it did before
  2026-12-04; sized like the mid shape deep in the tree at 16 workers (20,000 examples x 125 of
  1,000 cached features, 4,000 node-class columns of 51 bins, uint16 counts: a 51 MB histogram);
  the same work both ways, so their seconds compare as they are;
- **registers only**: an integer loop that touches no memory: the cores' own ceiling. A
  phase-2 row below it points at memory; a register row below N points at the machine.
orchard's forest rows (scaling_16c.json) are read against these in docs/scaling.md: its
effective parallelism cannot exceed what its kernel gets from the machine.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time

SIZES = {"full": {"examples": 20_000, "cached_features": 1_000, "features": 125, "columns": 4_000, "bins": 51,
                  "calls": 30, "spins": 1_500_000_000, "cores": None},
         "smoke": {"examples": 2_000, "cached_features": 100, "features": 25, "columns": 200, "bins": 51,
                   "calls": 2, "spins": 2_000_000, "cores": [1, 2]}}
ESTIMATE = "~1 min on 2 idle cores (2026-12-04); ~1-2 min on 16 (3 counts x 3 repeats x 3 kinds, 1-2 s of work each; a guess)"
KINDS = {"phase2 sparse": "phase-2 counting as orchard does it at this shape (sparse_counts.py: no histogram)",
         "phase2 dense": "phase-2 counting in a dense histogram (zeroed, bins counted, slices encoded)",
         "registers": "registers only (an integer loop, no memory traffic)"}


def core_counts(cores: int, wanted: list[int] | None = None) -> list[int]:
    """1, a quarter of the cores and all of them: the worker counts of the forest's rows it is read
    against (bench scaling_forest_few), in the minutes a lent machine's call has left beside them
    (``wanted``: these, where the cores exist)."""
    from bench.scaling import worker_counts

    return sorted({n for n in wanted if 1 <= n <= cores}) if wanted else worker_counts(cores, "few")


def phase2_work(size: dict, seed: int, sparse: bool):
    """A call doing one phase-2 task's counting (round_tasks.count_slices: the slices of two
    receiving actors) on data of ``size`` (made here, untimed), counted sparse or dense."""
    import numpy as np

    from workloads.forest.round_tasks import count_slices

    rng = np.random.default_rng(seed)
    codes = rng.integers(0, size["bins"], (size["examples"], size["cached_features"]), dtype=np.uint8)
    columns = np.sort(rng.integers(0, size["columns"], size["examples"])).astype(np.int64)  # grouped by column
    rows = rng.permutation(size["examples"]).astype(np.int64)
    by_block = [(None, codes, rows, rows, columns)]  # a cached block: its pixels are not read
    offsets = np.zeros((size["features"], 4), np.float32)
    thresholds = np.zeros((size["features"], size["bins"] - 1), np.float32)
    bounds = [0, size["columns"] // 2, size["columns"]]
    f0 = size["cached_features"] // 2

    return lambda: count_slices(by_block, f0, offsets, thresholds, 0.0, size["columns"], bounds, np.uint16,
                                sparse=sparse)[0]


def registers_work(size: dict, seed: int):
    """A call of ``size["spins"]`` steps of an integer recurrence: arithmetic on registers only."""
    from workloads.forest.jit import njit

    @njit
    def spin(n, x):
        acc = 0
        for _ in range(n):
            x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFF
            acc ^= x >> 11
        return acc

    return lambda: spin(size["spins"], seed + 1)


def one_process(kind: str, size: dict, seed: int, barrier, results) -> None:
    """A spawned process: its work made and run once untimed (compiles, first touch), then timed
    from the barrier's release."""
    import numba

    numba.set_num_threads(1)  # as a phase-2 task with cpus_per_worker 1 (round_tasks._ready_for_numba)
    work = registers_work(size, seed) if kind == "registers" else phase2_work(size, seed, kind == "phase2 sparse")
    work()
    barrier.wait()
    start = time.perf_counter()
    for _ in range(1 if kind == "registers" else size["calls"]):  # both countings the same work
        work()
    results.put(time.perf_counter() - start)


def at_count(kind: str, n: int, size: dict) -> float:
    """Seconds from the barrier to the last of ``n`` processes done, each with the same work."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=one_process, args=(kind, size, i, barrier, results)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        times = [results.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"forest_cores: a {kind} process at {n} exited {[p.exitcode for p in procs]}")
    return max(times)


def measure(size: dict, repeats: int) -> list[dict]:
    from bench.rows import row

    counts = core_counts(len(os.sched_getaffinity(0)), size["cores"])
    got = {(kind, n): [] for kind in KINDS for n in counts}
    for _ in range(repeats):  # each repeat runs every count of every kind: a drift lands on all alike
        for n in counts:
            for kind in KINDS:
                got[(kind, n)].append(at_count(kind, n, size))
                print(f"  forest_cores: {kind} x {n}: {got[(kind, n)][-1]:.2f} s", flush=True)
    rows = []
    for kind, label in KINDS.items():
        one = got[(kind, 1)]
        for n in counts[1:]:
            up = n * statistics.median(one) / statistics.median(got[(kind, n)])
            rows.append(row(f"forest kernel, {kind}: {n} processes vs 1 (same work each)", "s", got[(kind, n)], one,
                            higher_is_better=False, orchard_label=f"{n} processes at once", peer_label="1 process",
                            quality={"orchard": {"processes": n, "speed-up": round(up, 3),
                                                 "efficiency": round(up / n, 3)},
                                     "peer": {"processes": 1}},
                            note=f"{label}; weak scaling: speed-up = N x t(1) / t(N), the ratio is the efficiency"))
    return rows
