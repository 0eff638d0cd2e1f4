"""flower on one GPU: the figures issue 49 asks of ``experiment=flower_gpu``, side by side with their peers.

    python -m bench flower_gpu           # the run's two ends, images/s, GPU busy: ~10 min on one H200 (3 repeats)
    python -m bench flower_gpu_ps        # strategy=ps vs ring at one worker on one GPU: ~6 min
    python -m bench flower_gpu_sweep --repeats 1   # a 4-trial sweep sharing the GPU vs one trial at a time: ~8 min a repeat

A machine with CUDA only: ``python -m bench`` refuses these names elsewhere, in one line, before
anything starts (docs/flower.md, "On a GPU", says how to bring orchard to a lent GPU machine).
Every orchard figure is one real ``python -m orchard workload=flower experiment=flower_gpu
flower.epochs=E`` run; the data is prepared once by an untimed run first, so every timed run
reads its preparation back (the case issue 49's targets are set for).

- **flower_gpu** (results/flower_gpu.json):
  - *command to first step* and *last step to exit*, against the same ``run()`` wired by hand
    (ray.init + an MLflow run, bench/hand_wired.py; the same config, data and Train group), each
    side timed from outside its process and read through its own time split, alternating
    (bench/workload_overhead.py says how). Target: orchard <= 1.0x.
  - *seconds outside the steps*: the run's wall from outside less ``time/split/steps_s``.
    Target: <= 12 s on one GPU.
  - *images/s*: orchard's step windows (``throughput/mean_images_per_s``) against the model's own
    step in plain PyTorch in one process (bench/flower_plain_step.py: the same model, loss,
    optimizer, precision, layout and batch, data already on the GPU, no host sync). Target >= 0.9x.
  - *GPU busy over the run's wall*: NVML's utilization of the GPU read every 0.5 s by this
    process while each command runs, its mean over the command (both sides). Target >= 80%.
  - *GPU busy while training*: the worker's own sampler (``system/w0_gpu_util_pct_mean``). Target >= 90%.
- **flower_gpu_ps** (results/flower_gpu_ps.json): the step windows' images/s of ``strategy=ps``
  against ``strategy=ring`` at one worker, alternating, ``time/comm_wait_s`` beside. Target >= 0.9x.
- **flower_gpu_sweep** (results/flower_gpu_sweep.json): ``sweep=flower_gpu`` (4 trials) with each
  trial's worker on 1/8 of the GPU (orchard sizes the trials at once by the GPU's memory,
  docs/sweeps.md) against the same sweep with ``sweep.max_concurrent_trials=1``, FIFO on both
  (every trial trains all its epochs, so both sides do the same work). *Aggregate images/s*: each
  finished trial's images (its mean images/s times its step seconds) summed, over the sweep's wall
  from outside. Target >= 3x. *GPU busy over the sweep's wall* beside it. Target >= 80%.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRESET = ("experiment=flower_gpu",)
SIZES = {
    "full": {"parts": ["ends"], "epochs": 6, "plain_steps": 300},
    "ps": {"parts": ["ps"], "epochs": 6},
    "sweep": {"parts": ["sweep"], "epochs": 6, "samples": 2, "share": 0.125},
    "smoke": {"parts": ["ends", "ps", "sweep"], "epochs": 1, "plain_steps": 20, "samples": 1, "share": 0.25},
}
ESTIMATE = "flower_gpu ~10 min, flower_gpu_ps ~6 min, flower_gpu_sweep ~8 min a repeat, on one H200 (not yet run on one)"
TARGET_OUTSIDE_S, TARGET_BUSY_PCT, TARGET_TRAINING_BUSY_PCT = 12.0, 80.0, 90.0


def unmet() -> str | None:
    """Why these benches cannot run here, or None: they need a CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    return ("needs a CUDA GPU (torch.cuda.is_available() is False here); run it on a GPU machine "
            "(docs/flower.md, 'On a GPU')")


class GpuBusy:
    """GPU 0's utilization (NVML: the share of each sample period a kernel ran), read every
    ``every_s`` by a thread while a command runs; ``mean_pct`` is the share of the command's wall
    the GPU worked. A context manager, so a side of a bench wears it around its command."""

    def __init__(self, every_s: float = 0.5, index: int = 0):
        self.every_s, self.index, self.samples = every_s, index, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-busy", daemon=True)

    def __enter__(self) -> "GpuBusy":
        import pynvml  # nvidia-ml-py: on every GPU machine this bench runs on

        pynvml.nvmlInit()
        self._read = lambda handle=pynvml.nvmlDeviceGetHandleByIndex(self.index): \
            pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(float(self._read()))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def mean_pct(self) -> float:
        return statistics.fmean(self.samples) if self.samples else float("nan")


def busy(side: dict) -> float:
    seen = side.get("during")
    return seen.mean_pct if seen is not None else float("nan")


def median(values: list[float]) -> float | None:
    kept = [v for v in values if v == v]
    return statistics.median(kept) if kept else None


def orchard_only(name: str, unit: str, values: list[float], label: str, target_text: str, met,
                 higher_is_better: bool = True, quality: dict | None = None) -> dict:
    """A row with orchard's figure against a bound (``met(median) -> bool``), no peer."""
    from bench.rows import row

    m = median(values)
    return row(name, unit, values, None, orchard_label=label, peer_label=None, higher_is_better=higher_is_better,
               target={"text": target_text, "met": m is not None and met(m)}, quality=quality)


def plain_step(cfg_flower: dict, steps: int) -> dict:
    """One run of the plain-PyTorch step of the preset's model, batch, precision and layout."""
    cmd = [sys.executable, "-m", "bench.flower_plain_step", "--device", "cuda", "--tile", str(cfg_flower["tile_size"]),
           "--batch", str(cfg_flower["batch_size"]), "--precision", cfg_flower["precision"], "--steps", str(steps),
           "--lr", str(cfg_flower["optimizer"]["lr"]), *(["--channels-last"] if cfg_flower["channels_last"] else [])]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def ends_rows(ours: list[dict], peers: list[dict], plains: list[dict], label: str) -> list[dict]:
    """The flower_gpu rows from the sides' runs (bench/workload_overhead.py's dicts, each with the
    GpuBusy it wore as ``during``) and the plain step's results."""
    from bench.rows import row
    from bench.workload_overhead import PEER_LABEL, end_rows

    rows = end_rows("flower_gpu run (preparation reused)", label, ours, peers)
    outside = [s["wall_s"] - s["metrics"].get("time/split/steps_s", float("nan")) for s in ours]
    rows.append(orchard_only("flower_gpu run: seconds outside the steps (preparation reused)", "s", outside, label,
                             f"<= {TARGET_OUTSIDE_S:.0f} s on one GPU (issue 49)", lambda m: m <= TARGET_OUTSIDE_S,
                             higher_is_better=False, quality={"orchard": {"steps s": median([s["metrics"].get("time/split/steps_s", float("nan")) for s in ours])}}))
    mae = {"test/mae": ours[-1]["metrics"].get("test/mae"), "blob counter mae": ours[-1]["metrics"].get("test/baseline_mae")}
    rows.append(row("flower_gpu steps: images/s", "images/s",
                    [s["metrics"].get("throughput/mean_images_per_s", float("nan")) for s in ours],
                    [p["images_per_s"] for p in plains], higher_is_better=True, orchard_label=label,
                    peer_label="the model's own step in plain PyTorch, one process, data on the GPU (bench/flower_plain_step.py)",
                    quality={"orchard": mae, "peer": {"loss": plains[-1]["loss"]}},
                    target={"text": "orchard >= 0.9x the plain step", "min_ratio": 0.9}))
    rows.append(row("flower_gpu run: GPU busy over the run's wall", "%", [busy(s) for s in ours],
                    [busy(p) for p in peers], higher_is_better=True, orchard_label=label, peer_label=PEER_LABEL,
                    target={"text": f">= {TARGET_BUSY_PCT:.0f}% of the run's wall (issue 49)",
                            "met": (median([busy(s) for s in ours]) or 0) >= TARGET_BUSY_PCT}))
    rows.append(orchard_only("flower_gpu run: GPU busy while training (the worker's sampler)", "%",
                             [s["metrics"].get("system/w0_gpu_util_pct_mean", float("nan")) for s in ours], label,
                             f">= {TARGET_TRAINING_BUSY_PCT:.0f}% while training (issue 49)",
                             lambda m: m >= TARGET_TRAINING_BUSY_PCT))
    return rows


def ps_row(ps: list[dict], ring: list[dict], label: str) -> dict:
    from bench.rows import row

    def side(runs):
        return [s["metrics"].get("throughput/mean_images_per_s", float("nan")) for s in runs]

    def quality(runs):
        return {"comm wait s": median([s["metrics"].get("time/comm_wait_s", float("nan")) for s in runs]),
                "test/mae": runs[-1]["metrics"].get("test/mae")}

    return row("flower_gpu steps at one worker: images/s, ps vs ring", "images/s", side(ps), side(ring),
               higher_is_better=True, orchard_label=f"{label} strategy=ps", peer_label=f"{label} strategy=ring",
               quality={"orchard": quality(ps), "peer": quality(ring)},
               target={"text": "ps >= 0.9x ring (issue 49)", "min_ratio": 0.9})


def trial_images(trials: list[dict]) -> float:
    """Images the finished trials trained: each trial's mean images/s over its step seconds."""
    return sum(m.get("throughput/mean_images_per_s", 0.0) * m.get("time/split/steps_s", 0.0)
               for status, m in trials if status == "FINISHED")


def sweep_rows(shared: list[dict], alone: list[dict], label: str, share: float) -> list[dict]:
    """``shared``/``alone``: per repeat ``{"wall_s", "trials": [(status, metrics)], "busy_pct"}``."""
    from bench.rows import row

    def rate(s):
        return trial_images(s["trials"]) / s["wall_s"]

    def quality(runs):
        return {"trials finished": f"{sum(st == 'FINISHED' for st, _ in runs[-1]['trials'])}/{len(runs[-1]['trials'])}",
                "wall s": median([s["wall_s"] for s in runs])}

    shared_label = f"{label} strategy.gpus_per_worker={share} strategy.cpus_per_worker=1 (trials share the GPU)"
    alone_label = f"{label} sweep.max_concurrent_trials=1 (one trial at a time)"
    n = len(shared[-1]["trials"])
    return [row(f"flower_gpu sweep of {n} trials: aggregate images/s", "images/s", [rate(s) for s in shared],
                [rate(s) for s in alone], higher_is_better=True, orchard_label=shared_label, peer_label=alone_label,
                quality={"orchard": quality(shared), "peer": quality(alone)},
                target={"text": "sharing >= 3x one at a time (issue 49)", "min_ratio": 3.0}),
            row(f"flower_gpu sweep of {n} trials: GPU busy over the sweep's wall", "%",
                [s["busy_pct"] for s in shared], [s["busy_pct"] for s in alone], higher_is_better=True,
                orchard_label=shared_label, peer_label=alone_label,
                target={"text": f">= {TARGET_BUSY_PCT:.0f}% (issue 49)",
                        "met": (median([s["busy_pct"] for s in shared]) or 0) >= TARGET_BUSY_PCT})]


def sweep_size(size: dict) -> list[str]:
    return ["workload=flower", *PRESET, "sweep=flower_gpu", "sweep.scheduler=fifo", f"sweep.num_samples={size['samples']}",
            f"flower.epochs={size['epochs']}"]


def sweep_label(size: dict) -> str:
    return " ".join(["python -m orchard", *sweep_size(size)])


def sweep_overrides(folder: Path, tag: str, size: dict, alone: bool) -> list[str]:
    return [*sweep_size(size), f"strategy.gpus_per_worker={size['share']}", "strategy.cpus_per_worker=1",
            f"tracking.uri=sqlite:///{folder}/sweep-{tag}.db", f"output_dir={folder}/outputs", "progress=never",
            *(["sweep.max_concurrent_trials=1"] if alone else [])]


def run_sweep(folder: Path, tag: str, size: dict, alone: bool) -> dict:
    """One sweep from outside, in a store of its own: its wall, its trials' (status, metrics) and
    the GPU's busy share over it."""
    import time

    from mlflow.tracking import MlflowClient

    overrides = sweep_overrides(folder, tag, size, alone)
    with GpuBusy() as seen:
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "orchard", *overrides], cwd=folder, capture_output=True, text=True)
        wall = time.time() - t0
    if done.returncode != 0:
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        raise RuntimeError(f"sweep {tag} exited {done.returncode}: {lines[-1] if lines else ''}")
    client = MlflowClient(f"sqlite:///{folder}/sweep-{tag}.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    trials = [(r.info.status, dict(r.data.metrics)) for r in runs if "mlflow.parentRunId" in r.data.tags]
    return {"wall_s": wall, "trials": trials, "busy_pct": seen.mean_pct}


def measure(size: dict, repeats: int) -> list[dict]:
    why = unmet()
    if why:
        raise SystemExit(f"flower_gpu: {why}")
    from bench.workload_overhead import measure_sides, orchard_side
    from orchard.config import compose

    epochs = (f"flower.epochs={size['epochs']}",)
    label = f"python -m orchard workload=flower {' '.join(PRESET)} {epochs[0]}"
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-flower-gpu-") as tmp:
        folder = Path(tmp)
        if "ends" in size["parts"]:  # its warm-up prepares the data the other parts read back
            ours, peers = measure_sides("flower", folder, repeats, warmup=True, size=(*PRESET, *epochs),
                                        during=lambda _side: GpuBusy())
            flower_cfg = compose(["workload=flower", *PRESET, *epochs])["flower"]
            plains = [plain_step(flower_cfg, size["plain_steps"]) for _ in range(repeats)]
            rows += ends_rows(ours, peers, plains, label)
        else:
            orchard_side("flower", folder, size=(*PRESET, *epochs))  # prepares the data, untimed
        if "ps" in size["parts"]:
            ring, ps = [], []
            for _ in range(repeats):  # alternate, so a change of load hits both
                ring.append(orchard_side("flower", folder, size=(*PRESET, *epochs)))
                ps.append(orchard_side("flower", folder, size=(*PRESET, "strategy=ps", *epochs)))
            rows.append(ps_row(ps, ring, label))
        if "sweep" in size["parts"]:
            shared, alone = [], []
            for i in range(repeats):
                shared.append(run_sweep(folder, f"shared-{i}", size, alone=False))
                alone.append(run_sweep(folder, f"alone-{i}", size, alone=True))
            rows += sweep_rows(shared, alone, sweep_label(size), size["share"])
    return rows
