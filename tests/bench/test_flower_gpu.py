"""bench/flower_gpu.py: the GPU benches refuse a machine without CUDA in one line, before anything
starts; their configs are the documented commands; their rows say what the runs measured (from
the sides' own records, built here from stand-in records: the GPU is what cannot exist here); the
plain-PyTorch peer runs (on the CPU here, the same code as on a GPU); the GPU sampler reads NVML over
a command's wall (a stand-in NVML: the GPU's library is what cannot exist here)."""
from __future__ import annotations

import json
import sys
import time
import types

import pytest


def test_the_gpu_benches_refuse_a_machine_without_cuda_in_one_line(tmp_path, capsys):
    import torch

    from bench.__main__ import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without")
    for name in ("flower_gpu", "flower_gpu_ps", "flower_gpu_sweep"):
        with pytest.raises(SystemExit) as exit_:
            main([name, "--out", str(tmp_path)])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"bench: {name}: needs a CUDA GPU") and "docs/flower.md" in err[0]
    assert not list(tmp_path.iterdir())  # nothing ran, no results file


@pytest.mark.parametrize("size", ["full", "ps", "sweep", "smoke"])
def test_every_command_the_bench_runs_composes_and_validates(size, tmp_path):
    from bench import flower_gpu as fg
    from bench.workload_overhead import overrides
    from orchard.config import compose, registry, validate

    s = fg.SIZES[size]
    epochs = f"flower.epochs={s['epochs']}"
    commands = [overrides("flower", tmp_path, size=(*fg.PRESET, epochs))]
    if "ps" in s["parts"]:
        commands.append(overrides("flower", tmp_path, size=(*fg.PRESET, "strategy=ps", epochs)))
    if "sweep" in s["parts"]:
        commands += [fg.sweep_overrides(tmp_path, "t", s, alone) for alone in (False, True)]
    for command in commands:
        cfg = compose(command)
        validate(cfg, registry.load("flower"))
        assert cfg["flower"]["epochs"] == s["epochs"] and cfg["flower"]["tile_size"] == 224
    if "sweep" in s["parts"]:
        shared, alone = (compose(fg.sweep_overrides(tmp_path, "t", s, a)) for a in (False, True))
        assert shared["strategy"]["gpus_per_worker"] == alone["strategy"]["gpus_per_worker"] == s["share"]
        assert (shared["sweep"]["scheduler"], shared["sweep"]["max_concurrent_trials"]) == ("fifo", None)
        assert alone["sweep"]["max_concurrent_trials"] == 1 and shared["sweep"]["num_samples"] == s["samples"]


class _Busy:
    def __init__(self, pct):
        self.mean_pct = pct


def _side(wall, steps, images_per_s, busy, first=10.0, after=5.0, **metrics):
    return {"wall_s": wall, "to_first_step_s": first, "after_last_step_s": after, "work_s": steps,
            "status": "FINISHED", "headline": ("count_mae", 0.5), "during": _Busy(busy),
            "metrics": {"time/split/steps_s": steps, "throughput/mean_images_per_s": images_per_s,
                        "test/mae": 0.5, "test/baseline_mae": 3.0, **metrics}}


def test_the_rows_say_what_the_sides_measured():
    from bench import flower_gpu as fg
    from bench.rows import summarize

    ours = [_side(30.0, 20.0, 2000.0, 85.0, **{"system/w0_gpu_util_pct_mean": 95.0}) for _ in range(3)]
    peers = [_side(28.0, 20.0, 2050.0, 88.0, first=8.0) for _ in range(3)]
    plains = [{"images_per_s": 2200.0, "loss": 1.0}] * 3
    rows = {r["name"]: summarize(r) for r in fg.ends_rows(ours, peers, plains, "orchard label")}
    first = rows["flower_gpu run (preparation reused): command to first step"]
    assert first["ratio"] == pytest.approx(0.8) and first["target_met"] is False  # 8 s against orchard's 10 s
    outside = rows["flower_gpu run: seconds outside the steps (preparation reused)"]
    assert outside["orchard"]["median"] == pytest.approx(10.0) and outside["target_met"] is True  # 30 - 20 <= 12
    step = rows["flower_gpu steps: images/s"]
    assert step["ratio"] == pytest.approx(2000 / 2200) and step["target_met"] is True
    assert rows["flower_gpu run: GPU busy over the run's wall"]["target_met"] is True
    assert rows["flower_gpu run: GPU busy while training (the worker's sampler)"]["orchard"]["median"] == 95.0

    ps = [_side(30.0, 20.0, 1500.0, 50.0, **{"time/comm_wait_s": 2.0}) for _ in range(3)]
    r = summarize(fg.ps_row(ps, ours, "orchard label"))
    assert r["ratio"] == pytest.approx(0.75) and r["target_met"] is False
    assert r["quality"]["orchard"]["comm wait s"] == 2.0


def test_a_sweeps_images_are_its_finished_trials_images_over_its_wall():
    from bench import flower_gpu as fg
    from bench.rows import summarize

    done = {"throughput/mean_images_per_s": 100.0, "time/split/steps_s": 10.0}  # 1,000 images
    shared = [{"wall_s": 20.0, "busy_pct": 85.0, "trials": [("FINISHED", done)] * 4}] * 3
    alone = [{"wall_s": 80.0, "busy_pct": 20.0, "trials": [("FINISHED", done)] * 3 + [("FAILED", done)]}] * 3
    assert fg.trial_images(alone[0]["trials"]) == 3000.0  # a failed trial's images are not counted
    rate, busy = (summarize(r) for r in fg.sweep_rows(shared, alone, "label", 0.125))
    assert rate["name"] == "flower_gpu sweep of 4 trials: aggregate images/s"
    assert (rate["orchard"]["median"], rate["peer"]["median"]) == (200.0, 37.5) and rate["target_met"] is True
    assert rate["quality"]["peer"]["trials finished"] == "3/4"
    assert busy["target_met"] is True and busy["peer"]["median"] == 20.0


def test_the_plain_step_trains_the_flower_model(capsys):
    from bench import flower_plain_step

    flower_plain_step.main(["--device", "cpu", "--tile", "32", "--batch", "2", "--precision", "bf16",
                            "--channels-last", "--steps", "2", "--warmup", "1"])
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 2 and out["images_per_s"] > 0 and out["loss"] > 0


def test_gpu_busy_is_the_mean_of_nvml_over_the_commands_wall(monkeypatch):
    from bench.flower_gpu import GpuBusy

    readings = iter([0, 50, 100, 100] + [100] * 1000)
    nvml = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
                                 nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=next(readings)))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with GpuBusy(every_s=0.01) as seen:
        while len(seen.samples) < 4:
            time.sleep(0.01)
    assert seen.samples[:4] == [0.0, 50.0, 100.0, 100.0]
    assert 0 < seen.mean_pct <= 100 and not seen._thread.is_alive()
