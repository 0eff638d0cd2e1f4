"""workloads/forest/run.py through the real CLI path: config checks, smoke run into MLflow, resume."""
import numpy as np
import pytest

import workloads.forest as forest
from orchard import ConfigError
from orchard.tracking import bookkeeping
from tests.workloads.forest.helpers import rendered
from workloads.forest.checkpoint import CHECKPOINT_NAME, load_checkpoint


def test_default_config_composes_and_validates(compose):
    cfg = compose("workload=forest")
    assert cfg["strategy"]["name"] == "tasks"
    assert cfg["forest"]["examples_per_image"] == 2000 and cfg["forest"]["num_trees"] == 3
    forest.validate(cfg)
    paper = compose("workload=forest", "experiment=forest_paper")["forest"]
    assert (paper["n_offsets"], paper["n_thresholds"], paper["max_depth"]) == (2000, 50, 20)


@pytest.mark.parametrize("override,key", [
    ("forest.n_offsets=0", "forest.n_offsets"),
    ("forest.image_fraction=1.5", "forest.image_fraction"),
    ("forest.n_thresholds=64", "forest.n_thresholds"),
    ("forest.memory_budget_mb=0.01", "forest.memory_budget_mb"),
    ("forest.partitions.features=2001", "forest.partitions.features"),  # more parts than the 2,000 offsets
    ("forest.resume=/nonexistent/run", "forest.resume"),
])
def test_bad_config_is_a_config_error(compose, override, key):
    with pytest.raises(ConfigError) as err:
        forest.validate(compose("workload=forest", override))
    assert key in str(err.value)


def test_bad_config_exits_2_with_one_line(capsys):
    from orchard.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["workload=forest", "debug=smoke", "forest.n_thresholds=-3"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().startswith("orchard: bad config: forest.n_thresholds:")


def test_node_partitions_that_leave_no_cpu_end_the_smoke_run_failed_with_the_key(run_orchard, capsys):
    """16 histogram actors x 0.25 CPU on the session's 2 CPUs: the run waited for ever for the 9th;
    now it ends before its first tree (where the data step's last wave starts the actors), exit 2,
    its MLflow run FAILED with the key in its reason. Its summary offers the command again with
    another value: not a resume, which has no round to go on from (and would be refused), nor the
    same command."""
    refused = run_orchard("workload=forest", "debug=smoke", "forest.partitions.nodes=16")
    console = "".join(capsys.readouterr())
    assert refused.exit_code == 2 and refused.run.info.status == "FAILED"
    assert "forest.partitions.nodes: histogram actors" in refused.run.data.tags["orchard.error"]
    assert "resume:" not in console, console[-2000:]
    again = next(line for line in console.splitlines() if line.startswith("again:"))
    assert "with another forest.partitions.nodes: python -m orchard workload=forest debug=smoke" in again
    assert again.endswith(" forest.partitions.nodes=...") and "nodes=16" not in again


@pytest.mark.slow
def test_smoke_run_records_everything_and_resumes_identically(run_orchard):
    full = run_orchard("workload=forest", "debug=smoke")
    assert full.exit_code == 0, full.outcome
    m = full.run.data.metrics
    # better than chance (1/31) on held-out images, even at smoke size
    assert m["test/pixel_accuracy"] > 0.1 and m["test/mean_class_accuracy"] > 0.06
    assert m["throughput/inference_pixels_per_s"] > 0 and m["train/trees"] == 2
    # per-part accuracy as metrics and a figure; the shuffle is counted; nothing was skipped
    parts = {k for k in m if k.startswith("test/class_acc/")}
    assert len(parts) >= 20 and 0 <= m["test/worst_class_accuracy"] <= m["test/mean_class_accuracy"]
    assert m["train/shuffle_bytes"] > 0
    book = bookkeeping.read(full.client, full.run.info.run_id)   # data sizes and zero skips: no charts
    assert book["data/skipped_pairs"] == 0 and book["data/skipped_files"] == 0 and book["data/train_images"] > 0
    assert not [k for k in m if k.startswith("data/")]
    assert bookkeeping.chart_sections(m)[0] == "headline"   # the run page's charts open on the headline
    rounds = full.history("round/phase2_s")
    assert len(rounds) == 2 * 5                                     # trees x max_depth rounds
    for key in ("round/phase1_s", "round/phase3_s", "round/phase4_s", "round/frontier_size", "round/shuffle_bytes",
                "round/example_features_per_s", "round/hist_peak_bytes", "round/effective_parallelism",
                "round/examples_histogrammed", "round/subtraction_saved", "round/parent_hist_bytes",
                "round/parent_wire_bytes"):
        assert len(full.history(key)) == len(rounds), key
    assert 0.2 < m["train/subtraction_saved"] < 1   # below the root, larger children were derived
    # the rounds' seconds by phase: each the sum of its rounds, all of them the rounds' wall time
    phases = [m[f"train/{p}_s"] for p in ("bin_cache", "phase1", "phase2", "phase3", "phase4", "between_phases")]
    assert m["train/phase2_s"] == pytest.approx(sum(rounds)) and min(phases) >= 0
    assert sum(phases) == pytest.approx(sum(full.history("round/total_s")))
    assert m["train/parent_wire_bytes"] == 0       # ... from parents kept by the actors: on one node none crosses
    # the busy seconds behind each round's effective parallelism, by who was busy, and their sums
    busy = [t + a for t, a in zip(full.history("round/task_busy_s"), full.history("round/actor_busy_s"))]
    assert busy == pytest.approx([p * w for p, w in zip(full.history("round/effective_parallelism"),
                                                        full.history("round/total_s"))], rel=1e-6)
    assert m["train/task_busy_s"] == pytest.approx(sum(full.history("round/task_busy_s"))) and m["train/task_busy_s"] > 0
    assert m["train/actor_busy_s"] > 0 and m["train/phase2_tasks"] == sum(full.history("round/phase2_tasks")) > 0
    # nothing lost, nothing recounted: every slice acknowledged, every phase-3 answer with all its parts
    assert "train/restarts" not in m and book["train/restarts"] == 0   # a zero is bookkeeping, no chart
    # the processes those tasks ran in, counted as the rounds went: at least one, at most one per task
    processes = full.history("round/task_processes")
    assert processes == sorted(processes) and 1 <= m["train/task_processes"] == processes[-1] <= m["train/phase2_tasks"]
    # every smoke round is small (examples x offsets under small_round_example_features): the
    # driver sums them, and no histogram actor was started for nothing
    assert m["train/actors_started_early"] == 0 and set(full.history("round/phase3_threads")) == {0}
    # the bin cache: every tree encodes its bins in its first round (depth 0), never again, and
    # every round of the smoke run counts cached blocks
    encoding = full.history("round/bin_cache_s")
    assert [s > 0 for s in encoding] == [d == 0 for _ in range(2) for d in range(5)], encoding
    assert all(v > 0 for v in full.history("round/bin_cache_blocks"))
    assert {"figures/confusion_matrix.png", "figures/predicted_labelings.png",
            "figures/class_accuracy.png"} <= set(full.artifacts("figures"))
    assert "model/forest_checkpoint.npz" in full.artifacts("model")
    run_dir = full.run.data.tags["orchard.run_dir"]
    assert len(rendered(run_dir, "train")) == 16

    crashed = run_orchard("workload=forest", "debug=smoke", "forest.stop_after_rounds=7")
    assert crashed.exit_code == 1 and crashed.run.info.status == "FAILED"
    crashed_dir = crashed.run.data.tags["orchard.run_dir"]
    # every round's checkpoint went through storage.write_atomic: whole, and nothing half-written beside it
    from pathlib import Path
    assert not [p for d in (run_dir, crashed_dir) for p in Path(d).rglob("*.tmp-*")]
    assert load_checkpoint(Path(crashed_dir) / CHECKPOINT_NAME)["next_depth"] >= 1
    resumed = run_orchard("workload=forest", "debug=smoke", f"forest.resume={crashed_dir}")
    assert resumed.exit_code == 0, resumed.outcome
    assert len(resumed.history("round/phase2_s")) == 3              # only the missing rounds ran
    assert resumed.history("round/bin_cache_s")[0] > 0                # the resumed tree encodes its bins again
    a = load_checkpoint(f"{run_dir}/{CHECKPOINT_NAME}")
    b = load_checkpoint(f"{resumed.run.data.tags['orchard.run_dir']}/{CHECKPOINT_NAME}")
    for ta, tb in zip(a["trees"], b["trees"], strict=True):
        for k in ta:
            np.testing.assert_array_equal(ta[k], tb[k])
    assert resumed.run.data.metrics["test/pixel_accuracy"] == pytest.approx(m["test/pixel_accuracy"])
    # the three runs rendered the avatars once: the later two read the first one's folder
    hits = [bookkeeping.read(r.client, r.run.info.run_id)["cache/avatars_hits"] for r in (full, crashed, resumed)]
    assert hits == [0, 1, 1]
    assert [p.name[:8] for p in Path(run_dir).parents[1].joinpath("forest_data").iterdir()] == ["avatars-"]


@pytest.mark.slow
def test_deep_smoke_forest_counts_sparse_and_grows_the_tree_the_dense_path_grows(run_orchard):
    """The smoke forest with the paper's 50 thresholds and deeper: its deep tasks count straight
    into sparse slices (sparse_counts.py); the same run with no bin cache (every block on the fly:
    the dense path throughout) grows the identical tree."""
    deep = ("workload=forest", "debug=smoke", "forest.n_thresholds=50", "forest.max_depth=7", "forest.num_trees=1",
            "forest.small_round_example_features=0")
    sparse = run_orchard(*deep)
    dense = run_orchard(*deep, "forest.bin_cache_mb=0")
    assert sparse.exit_code == 0 and dense.exit_code == 0, (sparse.outcome, dense.outcome)
    assert sparse.run.data.metrics["train/phase2_sparse_tasks"] > 0
    # its rounds go through the actors: they started in the data step's last wave, not in round 0
    assert sparse.run.data.metrics["train/actors_started_early"] >= 2
    assert dense.run.data.metrics["train/phase2_sparse_tasks"] == 0
    a, b = (load_checkpoint(f"{r.run.data.tags['orchard.run_dir']}/{CHECKPOINT_NAME}") for r in (sparse, dense))
    for ta, tb in zip(a["trees"], b["trees"], strict=True):
        for k in ta:
            np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)
