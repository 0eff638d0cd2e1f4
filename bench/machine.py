"""What a result was measured on, and how busy the machine was meanwhile.

`describe()` names the machine (CPU model, cores, memory, GPU and driver, torch/CUDA) and the
package versions; `LoadSampler` records the load average before, during and after a bench, and
the CPU that processes *outside* the bench's own process tree used meanwhile. The second figure
is what "loaded" is decided on: a bench that keeps both cores of a 2-core machine busy drives the
load average to ~2 by itself, so the load average alone would call every honest run loaded. It
also watches for the machine being paused: a VM snapshotted or forked stops, drops its page cache
and resumes with its wall clock stepped forward (2026-12-03 00:27, ~19 s, mid-bench: the kernel
log said "crng reseeded due to virtual machine fork"); a step of more than a second between the
wall and the monotonic clock is recorded in ``paused_s`` and marks the bench loaded.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import time

import psutil

from orchard import background
from orchard.tracking.process_cpu import OwnCpu  # shared with the run's resource sampler

# a step between the wall and the monotonic clock larger than this is the machine paused, not NTP's slewing
PAUSE_S = 1.0
# the peers and the stack under orchard whose versions change the figures
PACKAGES = ("ray", "torch", "numpy", "numba", "mlflow", "hydra-core", "pyarrow", "av", "opencv-python-headless",
            "scikit-learn", "lightgbm", "xgboost", "decord", "torchcodec", "psutil")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[dict]:
    """One entry per GPU that `nvidia-smi` lists (none without the tool)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], check=False, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    return [{"name": r[0], "driver": r[1], "memory": r[2]} for r in rows if len(r) == 3]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# names the commit of a copied tree whose own git cannot say it (set by whoever copied a clean tree)
COPY_OF_COMMIT = "ORCHARD_BENCH_COMMIT"


def describe() -> dict:
    """The machine and software a result belongs to."""
    import torch

    from orchard.tracking.mlflow_run import git_commit

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                check=False, capture_output=True, text=True)
        readable, changes = status.returncode == 0, status.stdout.strip()
    except OSError:  # no git at all
        readable, changes = False, ""
    commit, dirty, source = git_commit(), changes != "" or not readable, "git"
    if os.environ.get(COPY_OF_COMMIT):
        # a copy of the tree whose own git cannot be trusted (the lent GPU machine gets a tree
        # whose .git names an older commit): the commit is the one its sender named, who copied
        # a clean tree of it (docs/benchmarks/flower.md)
        commit, dirty, source = os.environ[COPY_OF_COMMIT], False, COPY_OF_COMMIT
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
            "gpus": gpus(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "versions": versions(), "git_commit": commit, "git_dirty": dirty, "git_source": source}


def committed_head(prog: str) -> str:
    """HEAD's commit, for a record that names it; exits when the tree has uncommitted changes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                      text=True, check=True).stdout.strip():
        raise SystemExit(f"{prog}: the tree has uncommitted changes; commit first (the record names a commit)")
    return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def loadavg() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (every core, every process)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class LoadSampler:
    """Samples the load average and other processes' CPU every `interval_s` from a thread.

    `foreign` cores = (machine busy CPU - this process tree's CPU) / wall time, per window of
    `window_s`: what other users took while the bench ran.
    """

    def __init__(self, interval_s: float = 2.0, window_s: float = 30.0):
        self.interval_s, self.window_s = interval_s, window_s
        self.me = psutil.Process()
        self.own = OwnCpu(self.me)
        self.loads: list[float] = []
        self.windows: list[float] = []
        self.pauses: list[float] = []  # seconds the wall clock stepped past the monotonic one
        self._clock_offset = time.time() - time.monotonic()
        self._poller = background.Poller(self._sample, interval_s, "bench-load-sampler")
        self.before = self.after = None

    def idle_cores(self, seconds: float = 3.0) -> float:
        """Cores the machine kept busy over `seconds` before the bench started (nothing of ours runs)."""
        b0, t0 = busy_seconds(), time.monotonic()
        time.sleep(seconds)
        return max(0.0, (busy_seconds() - b0) / (time.monotonic() - t0))

    def start(self) -> None:
        self.before = {"load1": loadavg(), "busy_cores": self.idle_cores()}
        self._started = time.time()
        self._window = (busy_seconds(), self.own.sample(), time.monotonic())   # busy s, own s, its start
        self._poller.start()

    def _sample(self) -> None:
        self.loads.append(loadavg())
        offset = time.time() - time.monotonic()
        if abs(offset - self._clock_offset) > PAUSE_S:
            self.pauses.append(round(offset - self._clock_offset, 1))
        self._clock_offset = offset
        own = self.own.sample()  # every interval: a process that exits loses at most one
        w_busy, w_own, w_t = self._window
        now = time.monotonic()
        if now - w_t >= self.window_s:
            busy = busy_seconds()
            self.windows.append(self._foreign(busy - w_busy, own - w_own, now - w_t))
            self._window = (busy, own, now)

    def _last_window(self) -> None:
        w_busy, w_own, w_t = self._window
        now = time.monotonic()
        if now - w_t > 2 * self.interval_s or not self.windows:  # the last partial window
            busy, own = busy_seconds(), self.own.sample()
            self.windows.append(self._foreign(busy - w_busy, own - w_own, max(now - w_t, 1e-9)))

    @staticmethod
    def _foreign(busy_s: float, own_s: float, wall_s: float) -> float:
        """Cores used by others: the machine's busy time less ours (never below zero)."""
        cores = os.cpu_count() or 1
        return min(float(cores), max(0.0, (busy_s - max(0.0, own_s)) / wall_s))

    def stop(self) -> dict:
        self._poller.stop(timeout_s=60)
        self._last_window()
        self.after = {"load1": loadavg()}
        return self.summary()

    def summary(self) -> dict:
        return load_summary(os.cpu_count() or 1, self.before, self.loads, self.windows, self.after,
                            wall_s=time.time() - self._started, window_s=self.window_s, pauses=self.pauses)


def load_summary(cores: int, before: dict, loads: list[float], windows: list[float], after: dict,
                 wall_s: float | None, window_s: float | None, pauses: list[float]) -> dict:
    """A bench's load as its results file holds it: the load average before, during and after, the
    cores other processes took over each window (a sampler's 30 s, or a journal's runs), and
    whether that makes it loaded."""
    during = loads or [before["load1"]]
    foreign_max = max(windows) if windows else 0.0
    # Loaded: the machine was busy before we started, or other processes took more than half
    # the cores over any window while we ran. Our own load never counts against us.
    loaded = (before["load1"] > cores / 2 or before["busy_cores"] > cores / 2 or foreign_max > cores / 2
              or bool(pauses))
    return {"before": before, "during": {"load1_max": max(during), "load1_mean": sum(during) / len(during),
                                         "load1_samples": during[:: max(1, len(during) // 60)]},
            "after": after, "foreign_cores_max": foreign_max,
            "foreign_cores_windows": windows, "window_s": window_s,
            "wall_s": wall_s, "threshold": cores / 2, "paused_s": pauses,
            "loaded": loaded}


def as_an_operator_would() -> None:
    """The environment docs/cluster.md asks a cluster's operator to start every node with, set
    (unless set already) for the ``ray.cluster_utils.Cluster`` nodes a bench starts next, which
    inherit it: numba's cache folder named (the forest's kernels compile once for the whole bench,
    not on every cluster's first run) and idle workers kept a minute, as in the Ray orchard embeds.
    With Ray's default of a second, the nodes killed the forest's idle task processes between
    rounds and the video gate's between its tasks, and each successor paid a process start
    (docs/scaling.md, "forest at 16 workers: Ray killed the tasks' idle processes")."""
    from orchard.cluster import IDLE_WORKER_KEEP_MS, IDLE_WORKER_KILLING, numba_cache_dir

    os.environ.setdefault("NUMBA_CACHE_DIR", str(numba_cache_dir()))
    os.environ.setdefault(f"RAY_{IDLE_WORKER_KILLING}", str(IDLE_WORKER_KEEP_MS))


def start_ray(**kwargs) -> None:
    """A fresh local Ray for a bench (never another user's cluster), tried 3 times: on an
    overloaded machine the raylet can miss Ray's fixed 30 s start-up wait (such a run is
    marked loaded anyway, but it should still produce its rows)."""
    import ray

    for attempt in range(3):
        try:
            ray.init(address="local", include_dashboard=False, logging_level="ERROR", **kwargs)
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            ray.shutdown()
