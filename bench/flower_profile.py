"""Where flower's step loops go at 2 workers: ring beside plain DDP, ps-sync beside ring (issue 37).

    python -m bench flower_profile     # ~6 min on 2 idle cores (3 repeats)

The flower bench finds orchard's ring as fast as plain PyTorch DDP at 1 worker but slower per
step at 2 workers on a 2-core machine, and ps-sync a little behind ring. This bench says where
the differences go, on the flower bench's own work (its tiles, split, batch, epochs, model and
threads: flower_strategies.prepare_tiles_once), every side measured the same way:
- the step loop: the slowest worker's wall time in its steps (``steps_s``) and the CPU time each
  worker's process had over the same windows (``time.process_time``, all its threads): a worker
  with less CPU than wall time waited for a core (or for its peer); one with more ran threads
  side by side;
- everything else on the machine over the step loop's window (first step of any worker to the
  last step of any): every process's CPU time (psutil, sampled every second, interpolated at the
  window's ends), by process: Ray's daemons (raylet, GCS, monitors), each Ray actor by its class
  (orchard's metrics sink and samplers, Ray Train's controller, the parameter servers), idle Ray
  workers, this bench's process (the orchard driver on orchard's side; on the DDP side it only
  waits) and the rest: what else asked for the 2 cores while the workers stepped;
- one step under the torch profiler (step 6, rank 0, ring and DDP, in one extra run each, so the
  profiler's start does not count in the timed runs): its ops' self CPU time, so a difference in
  the step's own work (an extra op, a slower all-reduce) would show.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.flower_strategies import SIZES as FLOWER_SIZES
from bench.flower_strategies import orchard_outcome, plain_ddp_ranks, prepare_tiles_once, STRATEGIES
from orchard import background

WORKERS = 2
# profile_step: the step profiled on both sides, past the first ones (graph building, the first
# all-reduce); the smoke size has only a few steps an epoch
SIZES = {"full": {**FLOWER_SIZES["full"], "workers": [WORKERS], "strategies": ["ring", "ps-sync"], "profile_step": 6},
         "smoke": {**FLOWER_SIZES["smoke"], "workers": [WORKERS], "strategies": ["ring"], "profile_step": 2}}
ESTIMATE = "~6 min on 2 idle cores (3 repeats)"
TRAINING = "training workers"


class CpuAccount:
    """Every process's CPU time (user + system), sampled every ``every_s`` by a thread, and what
    each process is (its command line; a Ray worker's is re-read until it names an actor, since
    an idle worker becomes one when Ray hands it an actor)."""

    def __init__(self, every_s: float = 1.0):
        self.every_s = every_s
        self.samples: dict[int, list[tuple[float, float]]] = defaultdict(list)  # pid -> (time, cpu s)
        self.names: dict[int, str] = {}
        self._poller = background.Poller(self._sample, every_s, "cpu-account", at_once=True)

    def __enter__(self) -> "CpuAccount":
        self._poller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._poller.stop(timeout_s=10)

    def _sample(self) -> None:
        import psutil

        now = time.time()
        for proc in psutil.process_iter(["cpu_times"]):
            times = proc.info["cpu_times"]
            if times is None:
                continue
            if proc.pid not in self.names or _undecided(self.names[proc.pid]):
                try:
                    self.names[proc.pid] = " ".join(proc.cmdline() or [proc.name()])[:200]
                except psutil.Error:
                    self.names.setdefault(proc.pid, "")
            self.samples[proc.pid].append((now, times.user + times.system))

    def used(self, pid: int, start: float, end: float) -> float:
        """CPU seconds process ``pid`` used between ``start`` and ``end`` (a process that did not
        exist yet at ``start`` counts from nothing)."""
        series = self.samples.get(pid, [])
        if not series:
            return 0.0
        times, cpu = np.array([t for t, _ in series]), np.array([c for _, c in series])
        at_start = 0.0 if start < times[0] and cpu[0] < 0.5 else float(np.interp(start, times, cpu))
        return max(0.0, float(np.interp(end, times, cpu)) - at_start)

    def by_group(self, workers: set[int], start: float, end: float) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid in self.samples:
            out[self.group(pid, workers)] += self.used(pid, start, end)
        return dict(out)

    def group(self, pid: int, workers: set[int]) -> str:
        """What process ``pid`` is: the training workers, this bench's process, a Ray actor by its
        class (``ray::MetricsSink``), Ray's own daemons by name, idle Ray workers, or the rest."""
        name = self.names.get(pid, "")
        if pid in workers:
            return TRAINING
        if pid == os.getpid():
            return "bench process (driver)"
        if name.startswith("ray::"):
            # "ray::Class.method", or a named actor's "ray::<name>:Class": the class
            actor = name[5:].split()[0].split(".")[0].rsplit(":", 1)[-1]
            return "idle Ray workers" if actor == "IDLE" else f"ray::{actor}"
        if "default_worker.py" in name:
            return "idle Ray workers"
        for daemon in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env"):
            if daemon in name:
                return f"Ray: {daemon.removesuffix('.py')}"
        if "ray/_private" in name or "ray/autoscaler" in name:
            return "Ray: other"
        return "everything else"


def _undecided(name: str) -> bool:
    """A Ray worker process that may yet become an actor."""
    return "default_worker.py" in name or name.startswith("ray::IDLE") or not name


def window(ranks: list[dict]) -> tuple[float, float]:
    """The step loop's wall-clock window: the first step of any worker to the last step of any."""
    return min(r["first_step_at"] for r in ranks), max(r["last_step_at"] for r in ranks)


def account(ranks: list[dict], cpu: CpuAccount) -> dict:
    """One run's figures: the slowest worker's steps, every worker's CPU in its steps, and the
    CPU every group of processes used over the step loop's window."""
    start, end = window(ranks)
    slowest = max(ranks, key=lambda r: r["steps_s"])
    groups = cpu.by_group({int(r["pid"]) for r in ranks}, start, end)
    return {"steps_s": slowest["steps_s"], "window_s": end - start,
            "workers_cpu_s": [r["steps_cpu_s"] for r in sorted(ranks, key=lambda r: r["rank"])],
            "groups": groups, "beside_workers_s": sum(v for k, v in groups.items() if k != TRAINING)}


def self_times(trace: Path) -> tuple[float, dict[str, float]]:
    """A Chrome trace's span (ms) and each op's self CPU time (ms): its duration less that of the
    ops nested in it on the same thread."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    if not events:
        return 0.0, {}
    span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e3
    own: dict[str, float] = defaultdict(float)
    by_thread = defaultdict(list)
    for e in events:
        by_thread[e.get("tid")].append(e)
    for items in by_thread.values():
        items.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in items:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                own[stack[-1]["name"]] -= e["dur"] / 1e3
            own[e["name"]] += e["dur"] / 1e3
            stack.append(e)
    return span, dict(own)


def top_ops(profile: dict[str, float], n: int = 6) -> str:
    ranked = sorted(profile.items(), key=lambda kv: -kv[1])[:n]
    return "; ".join(f"{name} {ms:.1f}" for name, ms in ranked)


def run_orchard_ranks(overrides: list[str], out: Path) -> tuple[list[dict], str]:
    """One orchard run through the CLI's entry; its workers' records and its MLflow run id."""
    outcome = orchard_outcome(overrides)
    folder = out / "flower" / outcome.run_id / "workers"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))], outcome.run_id


def measure(size: dict, repeats: int) -> list[dict]:
    from bench.rows import row

    out = Path(tempfile.mkdtemp(prefix="flower_profile_"))
    common, setup = prepare_tiles_once(size, out)
    orchard = {name: [*common, *STRATEGIES[name], f"strategy.num_workers={WORKERS}"] for name in size["strategies"]}
    got: dict[str, list[dict]] = {name: [] for name in ("plain", *orchard)}
    for i in range(repeats):   # alternate, so a change of load hits every side
        with CpuAccount() as cpu, tempfile.TemporaryDirectory() as tmp:
            got["plain"].append(account(plain_ddp_ranks(WORKERS, setup, Path(tmp)), cpu))
        for name, overrides in orchard.items():
            with CpuAccount() as cpu:
                got[name].append(account(run_orchard_ranks(overrides, out)[0], cpu))
        print(f"  flower_profile {i}: " + "; ".join(f"{k} {v[-1]}" for k, v in got.items()), flush=True)
    ring = orchard["ring"]

    # one step of each side under the torch profiler, in a run of its own (not timed above)
    step = int(size["profile_step"])
    with tempfile.TemporaryDirectory() as tmp:
        plain_ddp_ranks(WORKERS, {**setup, "profile_step": step}, Path(tmp))
        plain_span, plain_ops = self_times(Path(tmp) / "trace_rank0.json")
    _, run_id = run_orchard_ranks([*ring, f"flower.profile_every={step}"], out)
    trace = next((out / "artifacts").rglob(f"{run_id}/**/traces/rank0_step{step}.json"))
    ring_span, ring_ops = self_times(trace)

    def med(side: str, key: str) -> float:
        return float(np.median([r[key] for r in got[side]]))

    def cpu_note(side: str) -> dict:
        workers = np.median([r["workers_cpu_s"] for r in got[side]], axis=0)
        return {"workers' CPU s in their steps": " + ".join(f"{w:.2f}" for w in workers),
                "step loop window s": f"{med(side, 'window_s'):.2f}"}

    def groups_note(side: str, most: int = 6) -> dict:
        """The processes beside the workers that used the most CPU over the window (medians)."""
        names = {k for r in got[side] for k in r["groups"] if k != TRAINING}
        medians = {k: float(np.median([r["groups"].get(k, 0.0) for r in got[side]])) for k in names}
        top = sorted(medians.items(), key=lambda kv: -kv[1])[:most]
        return {"by process, CPU s": "; ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.005) or "none"}

    def loop_rows(side: str, peer: str, labels: dict) -> list[dict]:
        what = f"{side} vs {'plain DDP' if peer == 'plain' else peer}, {WORKERS} workers, step loop"
        return [
            row(f"{what}: the slowest worker's time in its steps", "s",
                [r["steps_s"] for r in got[side]], [r["steps_s"] for r in got[peer]],
                higher_is_better=False, quality={"orchard": cpu_note(side), "peer": cpu_note(peer)}, **labels),
            row(f"{what}: the CPU the workers had in their steps (sum)", "CPU s",
                [sum(r["workers_cpu_s"]) for r in got[side]], [sum(r["workers_cpu_s"]) for r in got[peer]],
                higher_is_better=False, **labels,
                note="less CPU than wall time x workers: the worker waited for a core"),
            row(f"{what}: CPU used beside the workers over its window", "CPU s",
                [r["beside_workers_s"] for r in got[side]], [r["beside_workers_s"] for r in got[peer]],
                higher_is_better=False, quality={"orchard": groups_note(side), "peer": groups_note(peer)},
                **labels, note="every other process on the machine, CPU seconds by group"),
        ]

    rows = loop_rows("ring", "plain", {"orchard_label": "orchard ring", "peer_label": "plain PyTorch DDP (gloo)"})
    rows.append(row(f"ring vs plain DDP, one step under the torch profiler (step {step}, rank 0): its span", "ms",
                    [ring_span], [plain_span], higher_is_better=False,
                    orchard_label="orchard ring", peer_label="plain PyTorch DDP (gloo)",
                    quality={"orchard": {"top ops, self CPU ms": top_ops(ring_ops)},
                             "peer": {"top ops, self CPU ms": top_ops(plain_ops)}},
                    note="one profiled step a side (n=1)"))
    if "ps-sync" in got:
        rows += loop_rows("ps-sync", "ring", {"orchard_label": "orchard ps-sync", "peer_label": "orchard ring"})
    return rows
