"""orchard/sweep/space.py: a sweep's keys checked (one line naming the key), what a trial holds and
how many run at once, and every shipped sweep fitting a two-core machine."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchard.cluster.placement import bundles, HEAD, Resources
from orchard.errors import ConfigError
from orchard.run.lifecycle import prepare

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "conf" / "sweep").glob("*.yaml"))


def test_sweep_config_validation_names_the_key():
    with pytest.raises(ConfigError) as err:
        prepare(["workload=tiny", "sweep=tiny_typo"])
    assert err.value.key == "sweep.params.tiny.lrr"
    with pytest.raises(ConfigError) as err:
        prepare(["workload=tiny", "sweep=tiny_grid", "sweep.mode=best"])
    assert err.value.key == "sweep.mode"
    with pytest.raises(ConfigError) as err:  # CPU counts are the workload's to say, not the sweep file's
        prepare(["workload=tiny", "sweep=tiny_grid", "+sweep.resources_per_trial={cpu: 1}"])
    assert err.value.key == "sweep.resources_per_trial"


def test_no_shipped_sweep_writes_cpu_counts():
    for name in SHIPPED:
        text = (Path(__file__).resolve().parents[3] / "conf" / "sweep" / f"{name}.yaml").read_text()
        assert "resources_per_trial" not in text and "cpu:" not in text.lower(), name


def test_placement_reserves_what_a_trial_starts_and_limits_concurrency():
    actors = Resources(in_trial=bundles(2, 1.0))        # tasks/actors the trial starts itself
    train = Resources(in_trial=bundles(1, 1.0), outside=bundles(2, 1.0))  # + a Train worker group
    cluster = {"CPU": 2.0, "memory": 8 * 2**30}
    assert actors.factory().bundles == [HEAD, {"CPU": 1.0}, {"CPU": 1.0}]
    assert Resources(outside=bundles(2, 1.0)).factory().bundles == [HEAD]  # a small head, no CPU
    assert actors.max_concurrent(cluster) == 1
    assert actors.max_concurrent({"CPU": 8.0, "memory": 8 * 2**30}) == 4
    assert actors.max_concurrent({"CPU": 8.0, "memory": 8 * 2**30}, requested=3) == 3
    with pytest.raises(ConfigError, match="CPU 3 .cluster: 2"):
        train.max_concurrent(cluster)
    gpu = Resources(outside=bundles(2, 1.0, gpu=1.0))
    with pytest.raises(ConfigError, match="GPU"):
        gpu.max_concurrent(cluster)
    assert gpu.max_concurrent({**cluster, "CPU": 4.0, "GPU": 4.0}) == 2


def test_every_shipped_sweep_fits_a_two_core_machine(ray_session):
    """Each workload says what a trial starts; every shipped sweep runs on 2 cores, but the one
    made to fill a GPU, which fits 4 trials at once on its 16-core, 1-GPU machine (docs/sweeps.md)."""
    import importlib

    workloads = {"flower": "flower_lr", "forest": "forest_features", "singa": "singa_mlp", "video": "video_lr"}
    gpu_only = {"flower_gpu": ["workload=flower", "experiment=flower_gpu", "sweep=flower_gpu",
                               "strategy.gpus_per_worker=0.125", "strategy.cpus_per_worker=1"]}
    assert sorted([*workloads.values(), *gpu_only]) == SHIPPED  # every workload ships a sweep, every sweep is tested
    for overrides in gpu_only.values():
        cfg, module = prepare(overrides)
        lent = {"CPU": 16.0, "GPU": 1.0, "memory": 100 * 2**30}
        assert module.resources(cfg).max_concurrent(lent) >= 4
        with pytest.raises(ConfigError, match="GPU"):
            module.resources(cfg).max_concurrent({"CPU": 2.0, "memory": 8 * 2**30})
    two_cores = {"CPU": 2.0, "memory": 8 * 2**30}
    for workload, sweep in workloads.items():
        cfg, module = prepare([f"workload={workload}", f"sweep={sweep}"])
        need = module.resources(cfg)
        assert isinstance(need, Resources), workload
        assert need.max_concurrent(two_cores) >= 1, (workload, need.describe())
    flower, _ = prepare(["workload=flower", "strategy.num_workers=3"])
    need = importlib.import_module("workloads.flower").resources(flower)
    assert need.outside == bundles(3, 1.0)  # Ray Train workers: their own placement group
    video, _ = prepare(["workload=video"])
    need = importlib.import_module("workloads.video").resources(video)
    assert len(need.outside) == sum(video["video"]["workers"].values())
