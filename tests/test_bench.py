"""The benchmark runner: smoke mode runs every bench into a results folder, and the Markdown is
generated from results files alone, with loaded runs never saying "met". Timings are never asserted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import BENCHES, EXTRA_BENCHES
from bench.render import render
from bench.rows import ABSENT, installed, row, summarize

ROOT = Path(__file__).resolve().parents[1]


def bench_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m bench ...` in its own process group, all of which is killed if it overruns
    (the runner's child and the Ray it started would otherwise outlive the test)."""
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def result(name: str, loaded: bool, rows: list[dict], smoke: bool = False) -> dict:
    """A results file as the runner writes it, with a chosen load."""
    load = {"before": {"load1": 7.5 if loaded else 0.1, "busy_cores": 0.1}, "after": {"load1": 1.2},
            "during": {"load1_max": 9.0 if loaded else 1.9, "load1_mean": 1.5, "load1_samples": [1.5]},
            "foreign_cores_max": 0.05, "foreign_cores_windows": [0.05], "window_s": 30.0, "wall_s": 60.0,
            "threshold": 1.0, "loaded": loaded}
    machine = {"cpu_model": "Test CPU", "cores": 2, "memory_gib": 24.0, "platform": "Linux", "gpus": [],
               "torch": "2.13.0+cpu", "cuda": None, "versions": {"python": "3.11.7", "ray": "2.60.0"},
               "git_commit": "0123456789abcdef", "git_dirty": False}
    return {"schema": 1, "bench": name, "smoke": smoke, "repeats": 3, "command": f"python -m bench {name}",
            "rerun": f"python -m bench {name}", "started_utc": "2026-11-23T17:00:00+00:00", "wall_s": 60.0,
            "machine": machine, "load": load, "error": None, "estimate": "~1 min", "doc": "what and why",
            "rows": [summarize(r) for r in rows]}


def met_row() -> dict:
    return row("ring vs plain DDP, per step", "images/s", [120.0, 121.0, 119.0], [100.0, 101.0, 99.0],
               orchard_label="orchard ring", peer_label="plain DDP", higher_is_better=True,
               quality={"orchard": {"test MAE": 0.5}, "peer": {"test MAE": 0.52}},
               target={"text": "ring >= 0.95x plain DDP", "min_ratio": 0.95})


def test_render_marks_a_loaded_run_and_never_says_met(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "flower.json").write_text(json.dumps(result("flower", loaded=True, rows=[met_row()])))
    (results / "singa.json").write_text(json.dumps(result("singa", loaded=False, rows=[met_row()])))
    text = render(results, tmp_path / "benchmarks.md")
    assert text.startswith("# Benchmarks") and "Generated** by `python -m bench --render`" in text
    flower = text.split("## flower")[1].split("\n## ")[0]
    singa = text.split("## singa")[1].split("\n## ")[0]
    assert "**loaded**" in flower and "| loaded |" in flower and ": met" not in flower
    # the same figures from an idle machine do meet the target; ratio is orchard's speed / the peer's
    assert "ring >= 0.95x plain DDP: met" in singa and "1.20x" in singa
    assert "120 images/s (119-121, n=3), orchard ring" in singa and "test MAE 0.52" in singa
    for name in set(BENCHES) - {"flower", "singa"}:
        assert f"Not measured from a clean tree yet (run: `python -m bench {name}`)" in text


def test_render_smoke_and_missing_peer_rows(tmp_path):
    from bench.rows import missing

    (tmp_path / "forest.json").write_text(json.dumps(
        result("forest", loaded=False, smoke=True, rows=[met_row(), missing("orchard vs XGBoost rf", "XGBoost rf", "xgboost")])))
    text = render(tmp_path, tmp_path / "benchmarks.md")
    assert "smoke size: not a result" in text and "not installed (xgboost)" in text
    assert ": met" not in text


def test_only_other_processes_cpu_makes_a_run_loaded():
    from bench.machine import LoadSampler

    cores = os.cpu_count()
    # the bench itself keeping every core busy is not load; the same busy time from others is
    assert LoadSampler._foreign(busy_s=cores * 10.0, own_s=cores * 10.0, wall_s=10.0) == 0.0
    assert LoadSampler._foreign(busy_s=cores * 10.0, own_s=0.0, wall_s=10.0) == cores
    assert LoadSampler._foreign(busy_s=5.0, own_s=-30.0, wall_s=10.0) == 0.5  # never below zero


# a child that starts a CPU-bound grandchild and exits when told (a line on its stdin, once the
# test has seen both): the grandchild is re-parented to init, as Ray's workers are when the
# raylet stops, and its CPU must still count as the tree's
ORPHAN = """
import os, sys, time
if os.fork() == 0:
    t = time.process_time()
    while time.process_time() - t < 1.0:
        pass
    os._exit(0)
sys.stdin.readline()
"""


def test_cpu_of_a_process_that_left_the_tree_stays_ours():
    import psutil

    from orchard.tracking.process_cpu import OwnCpu

    child = subprocess.Popen([sys.executable, "-c", ORPHAN], stdin=subprocess.PIPE, text=True)
    own = OwnCpu(psutil.Process(child.pid))  # the child's tree: the test's own CPU is not in it
    tracked, deadline = 0, time.time() + 120
    while (child.poll() is None or len(own.seen) > 0) and time.time() < deadline:  # until the orphan exited
        own.sample()  # sampled often, as the sampler does: only the last moment may be missed
        tracked = max(tracked, len(own.seen))
        if tracked == 2 and child.poll() is None and not child.stdin.closed:
            child.stdin.write("exit\n")  # both seen: the child leaves its grandchild behind
            child.stdin.close()
        time.sleep(0.05)
    assert tracked == 2  # child and grandchild were both seen
    assert own.total >= 0.8, own.total


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    bad = bench_cli("nosuchbench", "--out", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"bench: names: unknown bench 'nosuchbench'; allowed: {', '.join([*BENCHES, *EXTRA_BENCHES])}"]
    few = bench_cli("forest", "--repeats", "1", "--out", str(tmp_path))
    assert few.returncode == 2 and "--repeats" in few.stderr
    # one repeat is a result only for the hour-long benches, and only when they alone are named
    from bench.__main__ import min_repeats
    assert min_repeats(["forest_paper"]) == 1
    assert min_repeats(["forest_paper", "forest"]) == min_repeats([]) == 3
    none = bench_cli("forest_paper", "--repeats", "0", "--out", str(tmp_path))
    assert none.returncode == 2 and "--repeats" in none.stderr
    into_docs = bench_cli("forest", "--smoke", "--out", str(ROOT / "docs" / "benchmarks" / "results"))
    assert into_docs.returncode == 2 and "smoke results never go to" in into_docs.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_video_shift_bench_runs_both_sides_and_the_shifted_run_relaunches_with_the_new_counts(
        tmp_path, monkeypatch):
    """A bench run by name only (not in `python -m bench`): two smoke video runs, the notes' worker
    shift applied in one. The shifted run is also the end-to-end test of video.shift_apply (one
    run serves both): the rule moves a worker between the streams' Train runs at an epoch mark
    (ratio 1.0 makes any gap in validation loss a shift; shallow queues keep the feeder within an
    epoch or two of the trainers, so the shift lands inside the run), and every epoch is still
    trained and validated once by each stream."""
    from mlflow.tracking import MlflowClient

    from bench.video_shift import KEEP_RUNS_ENV

    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv(KEEP_RUNS_ENV, str(runs))
    done = bench_cli("video_shift", "--smoke", "--out", str(tmp_path), timeout=800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (r,) = json.loads((tmp_path / "video_shift.json").read_text())["rows"]
    assert r["status"] == "ok" and r["orchard"]["median"] > 0 and r["peer"]["median"] > 0
    assert r["quality"]["orchard"]["shifts applied"] >= 1 and r["quality"]["peer"]["shifts applied"] == 0

    client = MlflowClient(f"sqlite:///{runs}/shift1_0.db")
    (run,) = client.search_runs([client.get_experiment_by_name("video").experiment_id])
    m = run.data.metrics
    assert m["alloc/shifts_applied"] >= 1 and m["alloc/shift_wait_s"] >= 0
    table = client.download_artifacts(run.info.run_id, "tables/worker_allocation.json", str(tmp_path))
    history = json.loads(Path(table).read_text())["epochs"]
    assert [h for h in history if "applied from epoch" in h["shift_rule"]], history
    # the counts that trained each epoch: 2 + 2 at first, then one worker moved (the total is kept)
    per_epoch = [{s: h["workers"][s] for s in ("spatial", "temporal")} for h in history]
    assert per_epoch[0] == {"spatial": 2, "temporal": 2}
    assert any(w != per_epoch[0] for w in per_epoch) and all(sum(w.values()) == 4 for w in per_epoch)
    assert m["train/epochs_run"] == 4  # every epoch trained and validated once by each stream, relaunch or not
    for stream in ("spatial", "temporal"):
        steps = [mm.step for mm in client.get_metric_history(run.info.run_id, f"val/{stream}_top1")]
        assert sorted(steps) == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_smoke_mode_runs_every_bench_into_a_results_file(tmp_path):
    # ~3 min on 2 idle cores; far longer on a loaded machine, hence the generous limits
    done = bench_cli("--smoke", "--out", str(tmp_path), "--render", timeout=1400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    for name in BENCHES:
        res = json.loads((tmp_path / f"{name}.json").read_text())
        assert res["smoke"] is True and res["repeats"] == 1 and res["error"] is None
        assert res["command"] == f"python -m bench --smoke --out {tmp_path} --render"
        m = res["machine"]
        assert m["cores"] >= 1 and m["cpu_model"] and m["memory_gib"] > 0 and len(m["git_commit"]) == 40
        assert m["versions"]["ray"] == "2.60.0" and m["torch"].startswith("2.")
        assert {"before", "during", "after", "loaded", "foreign_cores_max"} <= set(res["load"])
        assert res["rows"], name
        for r in res["rows"]:
            if r["status"].startswith(ABSENT):  # a peer that cannot run here says why
                continue
            assert r["status"] == "ok", (name, r["name"], r["status"])
            assert len(r["orchard"]["values"]) == 1 and r["orchard"]["median"] > 0, (name, r["name"])
            if r["peer"] is not None:
                assert r["peer"]["median"] > 0 and r["ratio"] > 0, (name, r["name"])
                assert r["quality"]["orchard"] and r["quality"]["peer"], (name, r["name"])
    # output equality where the bench can check it: the decoders gave the same frames
    video = json.loads((tmp_path / "video.json").read_text())
    decode = [r for r in video["rows"] if r["name"].startswith("decode ") and r["status"] == "ok"]
    assert decode and all(r["quality"]["peer"]["checksum"] == "equal to orchard's" for r in decode)
    # decord and torchcodec (the bench extra) are measured where they are installed, torchcodec
    # over PyAV's FFmpeg; where not, their rows say so
    decord = [r for r in video["rows"] if "decord" in r["name"]]
    assert len(decord) == 2 and all((r["status"] == "ok") == installed("decord") for r in decord)
    (codec,) = [r for r in video["rows"] if "torchcodec" in r["name"]]
    assert (codec["status"] == "ok") == installed("torchcodec"), codec["status"]
    # the metrics API against MLflow's own async logging, every value found in its store
    overhead = json.loads((tmp_path / "overhead.json").read_text())
    (api_async,) = [r for r in overhead["rows"] if "async" in r["name"]]
    logged = api_async["quality"]["peer"]["values in store"]
    assert logged.split("/")[0] == logged.split("/")[1], logged
    text = (tmp_path / "benchmarks.md").read_text()
    assert "smoke size: not a result" in text and ": met" not in text


@pytest.mark.timeout(600)
def test_a_peer_over_the_time_limit_is_stopped_and_becomes_a_failed_row_with_its_memory():
    """A system still running after the bench's limit (or killed by the kernel for memory) is
    measured in the bench's own process: stopped, its peak memory kept, its error a row; the
    bench goes on instead of waiting for a result that never comes."""
    import shutil

    from bench.forest_vs_peers import SMOKE, measure_one, prepare

    cfg, data_dir, _, _ = prepare(SMOKE)
    try:
        out = measure_one("sklearn RF", cfg, data_dir, limit_s=0.5)  # spawn + imports alone take longer
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    assert out["error"] == "stopped: still training after 0 min" and out["stopped_after_s"] == 0.5
    assert out["peak_bytes"] > 10 * 2**20                              # sampled from outside the child


@pytest.mark.timeout(600)
def test_the_forest_bench_script_prints_the_table_and_orchards_profile_per_round(capsys):
    """`python bench/forest_vs_peers.py --profile` (the command docs/benchmarks/forest.md gives):
    orchard's time per round and phase, then the side-by-side table, limited to the systems asked."""
    from bench.forest_vs_peers import main

    main(["--shape", "smoke", "--systems", "sklearn ExtraTrees", "--profile"])
    out = capsys.readouterr().out
    assert "| tree | depth | frontier | batches | bin cache | phase 1 |" in out
    profile = [line for line in out.splitlines() if line.startswith("| 0 | ")]
    assert len(profile) >= 2                                   # one line per round of the one tree
    assert "orchard vs sklearn ExtraTrees" in out
    assert "LightGBM" not in out and "orchard@1" not in out    # left out by --systems
    assert "load average at start:" in out and "load average at end:" in out
    with pytest.raises(SystemExit):
        main(["--systems", "CatBoost"])


@pytest.mark.timeout(600)
def test_where_the_peers_matrix_outgrows_memory_they_are_refused_and_orchard_trains_within_its_budget(monkeypatch):
    """issue 34's beyond-memory row: a peer whose float32 matrix exceeds this machine's memory is
    not started; its row says why and carries orchard's time, accuracy and its memory bound, which
    is decided on one repeat (a bound orchard kept or not, not a timing)."""
    import psutil

    from bench import forest_vs_peers as fvp
    from bench.render import decided
    from bench.rows import summarize

    total = psutil.virtual_memory().total
    assert fvp.refusal(total // 2) is None
    assert fvp.refusal(2 * total).startswith("refused before start: its feature matrix (")
    monkeypatch.setattr(fvp, "refusal", lambda matrix_bytes: "refused before start: (as if) too big")
    size = {**fvp.SIZES["smoke"], "scaling": False, "variants": [], "memory_budget_gib": 12}
    rows = [summarize(r) for r in fvp.measure(size, 1)]
    refused = [r for r in rows if r["status"] == "refused before start: (as if) too big"]
    assert {r["name"] for r in refused} == {f"smoke: orchard vs {p}" for p in fvp.PEERS}
    for r in refused:
        assert len(r["orchard"]["values"]) == 1 and r["peer"]["values"] == []
        assert r["quality"]["orchard"]["class acc"] > 0 and "effective parallelism, run" in r["quality"]["orchard"]
        assert r["target_met"] is True and decided(r) == "met (n=1)"      # a smoke run stays far under 12 GiB


def test_the_fastest_peer_is_the_fastest_at_orchards_class_accuracy_or_above():
    """issue 34, Must-have 1: the peer orchard must beat by 1.25x is the fastest of those whose
    class accuracy is within 0.01 of orchard's or above; a faster, less accurate one does not count."""
    from bench.forest_vs_peers import fastest_peer, most_accurate_peer

    def runs(acc, seconds):
        return [{"acc": (0.6, acc), "train_s": seconds, "matrix_s": 1.0}]

    orchard = runs(0.48, 10.0)
    all_runs = {"orchard": orchard, "XGBoost rf": runs(0.475, 20.0), "LightGBM rf": runs(0.50, 30.0),
                "sklearn ExtraTrees": runs(0.43, 5.0)}
    assert fastest_peer(all_runs, {}, orchard) == "XGBoost rf"
    assert fastest_peer(all_runs, {"XGBoost rf": "died"}, orchard) == "LightGBM rf"
    assert fastest_peer({"orchard": orchard, "sklearn ExtraTrees": runs(0.43, 5.0)}, {}, orchard) is None
    # then the row holds orchard to the same ratio against the most accurate peer
    assert most_accurate_peer({**all_runs, "LightGBM rf": runs(0.41, 30.0)}, {}) == "XGBoost rf"
    assert most_accurate_peer(all_runs, {"LightGBM rf": "died", "XGBoost rf": "died"}) == "sklearn ExtraTrees"


def test_the_flower_profile_counts_self_time_per_op_and_cpu_per_process(tmp_path):
    """bench/flower_profile.py's two measures: an op's self time is its duration less that of the
    ops nested in it on its thread (a Chrome trace as the torch profiler writes it), and a
    process's CPU seconds over a window come from psutil's samples (this process, burning CPU)."""
    from bench.flower_profile import CpuAccount, self_times

    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 0, "dur": 10_000, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "ts": 1_000, "dur": 8_000, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": 12_000, "dur": 2_000, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 3_000, "dur": 5_000, "tid": 2},
        {"ph": "X", "cat": "python_function", "name": "not an op", "ts": 0, "dur": 99_000, "tid": 1}]}))
    span, own = self_times(trace)
    assert span == 14.0
    assert own == {"aten::conv2d": 2.0, "aten::convolution": 8.0, "aten::add_": 2.0, "c10d::allreduce_": 5.0}

    busy = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass\nprint(time.process_time())"
    with CpuAccount(every_s=0.1) as cpu:
        start = time.time()
        child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
        spent = float(child.communicate()[0])   # the CPU time the child counted itself
        end = time.time()
        time.sleep(0.3)
    # what psutil saw of it, within the samples' interpolation at the window's ends
    assert spent > 0.1 and abs(cpu.used(child.pid, start, end) - spent) <= 0.3
    assert cpu.group(os.getpid(), set()) == "bench process (driver)"
    assert cpu.group(os.getpid(), {os.getpid()}) == "training workers"
    # Ray's processes by what they are: an actor by its class, whatever method it runs
    cpu.names.update({1: "ray::orchard-sink-5b9e7f92:MetricsSink.log_metrics", 2: "ray::IDLE", 3: "/venv/lib/ray/core/src/ray/raylet/raylet --x",
                      4: "python /venv/lib/ray/_private/workers/default_worker.py --node-ip-address=1"})
    assert [cpu.group(p, set()) for p in (1, 2, 3, 4)] == ["ray::MetricsSink", "idle Ray workers", "Ray: raylet",
                                                           "idle Ray workers"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_flower_profile_bench_runs_every_side_and_profiles_a_step_of_each(tmp_path):
    """`python -m bench flower_profile --smoke` (run by name only): plain DDP and orchard's ring
    measured alike, the CPU beside the workers attributed by process, one profiled step each."""
    done = bench_cli("flower_profile", "--smoke", "--out", str(tmp_path), timeout=800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "flower_profile.json").read_text())["rows"]}
    assert all(r["status"] == "ok" and r["orchard"]["median"] > 0 and r["peer"]["median"] > 0 for r in rows.values())
    beside = rows["ring vs plain DDP, 2 workers, step loop: CPU used beside the workers over its window"]
    assert "ray::" in beside["quality"]["orchard"]["by process, CPU s"]   # Ray's actors ran beside orchard's workers
    (step,) = [r for name, r in rows.items() if "torch profiler" in name]
    assert "aten::" in step["quality"]["orchard"]["top ops, self CPU ms"] and "aten::" in step["quality"]["peer"]["top ops, self CPU ms"]
