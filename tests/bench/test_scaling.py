"""bench/scaling.py: its rows say what issue 48 and its scale-out acceptance check read (each
workload's worker counts with their effective parallelism, a one-node vs more-nodes row with the
same CPUs), and one real orchard run attached to a cluster comes back with its work seconds,
CPU parallelism and loopback bytes. Timings are never asserted."""
from __future__ import annotations

import pytest

from tests.session_ray import attach_overrides


def test_the_rows_pair_each_count_with_one_worker_and_more_nodes_with_one(monkeypatch):
    from bench import scaling

    calls = []

    class FakeCluster:
        def __init__(self, nodes):
            self.address, self.nodes = f"127.0.0.1:{6379 + nodes}", nodes

        def shutdown(self):
            calls.append(("down", self.nodes))

    def one_run(workload, workers, address, folder, smoke_sizes):
        nodes = int(address.rsplit(":", 1)[1]) - 6379
        calls.append((workload, workers, nodes))
        out = {"work_s": 12.0 / workers * (1.1 if nodes > 1 else 1.0), "wall_s": 30.0, "total_s": 29.0,
               "cpu_parallelism": 0.9 * workers, "loopback_bytes": 1e6 * nodes}
        return {**out, "effective_parallelism": 0.8 * workers} if workload == "forest" else out

    monkeypatch.setattr(scaling.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(scaling, "start_cluster", lambda nodes, cpus: FakeCluster(nodes))
    monkeypatch.setattr(scaling, "one_run", one_run)
    rows = scaling.measure({"workloads": ["forest", "singa"], "smoke_sizes": True}, 2)

    # each repeat starts the clusters one at a time (1, 2, 4 nodes) and runs every workload on each:
    # on one node the counts in turn, on more all the cores; one untimed run per workload, first
    # of all its runs (numba's cache, kept by content, serves every later cluster). The clusters
    # run the workloads in turns of direction, so the forest's all-core run on one node and its
    # run on two nodes are next to each other (the two sides of the bound the scale-out check reads)
    def one_repeat(untimed):
        return [*untimed("singa"), *[("singa", w, 1) for w in (1, 2, 4)],
                *untimed("forest"), *[("forest", w, 1) for w in (1, 2, 4)], ("down", 1),
                ("forest", 4, 2), ("singa", 4, 2), ("down", 2), ("singa", 4, 4), ("forest", 4, 4), ("down", 4)]

    assert calls == one_repeat(lambda w: [(w, 4, 1)]) + one_repeat(lambda w: [])
    names = [r["name"] for r in rows]
    assert names == ["forest: 2 workers vs 1 worker", "forest: 4 workers vs 1 worker",
                     "forest: 2 nodes vs one node (same 4 CPUs)", "forest: 4 nodes vs one node (same 4 CPUs)",
                     "singa: 2 workers vs 1 worker", "singa: 4 workers vs 1 worker",
                     "singa: 2 nodes vs one node (same 4 CPUs)", "singa: 4 nodes vs one node (same 4 CPUs)"]
    four = rows[1]["quality"]["orchard"]
    # forest's effective parallelism is its own (seed 000's); the others' the CPU figure
    assert four["workers"] == 4 and four["effective parallelism"] == pytest.approx(3.2)
    assert four["speed-up"] == pytest.approx(4.0) and four["efficiency"] == pytest.approx(1.0)
    assert rows[5]["quality"]["orchard"]["effective parallelism"] == pytest.approx(3.6)
    # the worker rows never say "node" (the check finds the forest's node row by it)
    assert [n for n in names if "node" in n and n.startswith("forest")][0] == "forest: 2 nodes vs one node (same 4 CPUs)"
    two = rows[2]
    assert two["orchard"]["values"] == [pytest.approx(3.3)] * 2 and two["peer"]["values"] == [3.0, 3.0]
    # the forest runs at a shape with enough work: no debug=smoke; the others shrink with it
    assert "debug=smoke" not in scaling.run_overrides("forest") and "forest.max_depth=14" in scaling.run_overrides("forest")
    assert scaling.run_overrides("flower ps")[:2] == ["workload=flower", "debug=smoke"]
    assert scaling.run_overrides("forest", smoke_sizes=True) == ["workload=forest", "debug=smoke"]
    assert two["quality"]["orchard"]["nodes"] == 2 and two["quality"]["orchard"]["loopback MB"] == 2.0


def _measured_on_16_cores(monkeypatch, size: str, work_s: float = 0.0, parallel_share: float = 0.0, result=None,
                          folders=None):
    """bench.scaling.measure(size) on a pretend 16-core machine, each run taking work_s / workers
    at an effective parallelism of parallel_share x workers, or ``result(workload, workers)``;
    (rows, the calls in order). ``folders``: a dict given gets each workload's run folders."""
    from bench import scaling

    calls = []

    class FakeCluster:
        address = "127.0.0.1:6380"

        def shutdown(self):
            calls.append("down")

    def one_run(workload, workers, address, folder, smoke_sizes):
        calls.append((workload, workers))
        if folders is not None:
            folders.setdefault(workload, set()).add(folder)
        if result:
            return result(workload, workers)
        return {"work_s": work_s / workers, "wall_s": 40.0, "total_s": 30.0, "cpu_parallelism": 1.0,
                "loopback_bytes": 1e6, "effective_parallelism": parallel_share * workers}

    monkeypatch.setattr(scaling.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(scaling, "start_cluster", lambda nodes, cpus: FakeCluster())
    monkeypatch.setattr(scaling, "one_run", one_run)
    return scaling.measure(scaling.SIZES[size], 3), calls


def test_the_benchs_clusters_start_as_docs_cluster_md_asks_an_operator_to_start_them(monkeypatch, tmp_path):
    """Idle workers kept a minute, numba's cache named: with Ray's default second the nodes
    replaced the forest's idle task processes between rounds (docs/scaling.md)."""
    from bench import scaling
    from orchard.cluster import IDLE_WORKER_KEEP_MS

    key = "RAY_idle_worker_killing_time_threshold_ms"
    monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    seen = []

    class FakeCluster:
        address = "127.0.0.1:6380"

        def __init__(self):  # what the nodes' processes would inherit
            seen.append((scaling.os.environ.get(key), scaling.os.environ.get("NUMBA_CACHE_DIR")))

        def shutdown(self):
            pass

    monkeypatch.setattr(scaling.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(scaling, "start_cluster", lambda nodes, cpus: FakeCluster())
    monkeypatch.setattr(scaling, "one_run", lambda *a: {"work_s": 1.0, "wall_s": 2.0, "total_s": 2.0,
                                                         "cpu_parallelism": 1.0, "loopback_bytes": 0})
    scaling.measure({"workloads": ["singa"], "smoke_sizes": True, "nodes": [1]}, 1)
    assert seen and all(keep == str(IDLE_WORKER_KEEP_MS) and cache for keep, cache in seen)
    # an operator's own setting wins
    monkeypatch.setenv(key, "5000")
    seen.clear()
    scaling.measure({"workloads": ["singa"], "smoke_sizes": True, "nodes": [1]}, 1)
    assert seen[0][0] == "5000"


def test_the_few_counts_size_sweeps_1_a_quarter_and_all_cores_on_one_node(monkeypatch):
    from bench import scaling

    rows, calls = _measured_on_16_cores(monkeypatch, "forest_few", 20.0, 0.9)
    # one node, started once a repeat, the untimed run first of all
    assert calls == [("forest", 16), *([*[("forest", w) for w in (1, 4, 16)], "down"] * 3)]
    assert [r["name"] for r in rows] == ["forest: 4 workers vs 1 worker", "forest: 16 workers vs 1 worker"]
    assert rows[-1]["quality"]["orchard"]["workers"] == 16
    assert scaling.worker_counts(2, "few") == [1, 2] and scaling.worker_counts(8) == [1, 2, 4, 8]


def test_the_paper_size_compares_all_cores_with_a_quarter_at_the_paper_shape(monkeypatch):
    """A one-worker run of the paper shape takes minutes on 16 cores: its rows' base is a
    quarter of the cores, the efficiency counted against it, and the runs are the paper shape."""
    from bench import scaling

    rows, calls = _measured_on_16_cores(monkeypatch, "forest_paper", 40.0, 0.8)
    assert calls == [("forest paper", 16), *([*[("forest paper", w) for w in (4, 16)], "down"] * 3)]
    [r] = rows
    assert r["name"] == "forest paper: 16 workers vs 4 workers"
    q = r["quality"]["orchard"]
    assert (q["workers"], q["speed-up"], q["efficiency"], q["effective parallelism"]) == (16, 4.0, 1.0, 12.8)
    assert r["quality"]["peer"]["workers"] == 4
    overrides = scaling.run_overrides("forest paper")
    assert overrides[0] == "workload=forest" and "forest.n_offsets=2000" in overrides and "debug=smoke" not in overrides
    assert not any(o.startswith("forest.partitions") for o in overrides)  # the workload's own partitions
    assert not set(scaling.PAPER) & set(scaling.SIZES["full"]["workloads"] + scaling.SIZES["smoke"]["workloads"])


def test_the_actors_size_compares_a_quarter_of_the_actors_with_one_per_worker_on_all_cores(monkeypatch):
    """bench forest_actors: the paper shape on all the cores, twice a repeat (one actor per worker,
    then a quarter of them), one row: the quarter against the default, each side's figures its own.
    The quarter runs in the default's folder, on its data: one untimed run warms both."""
    from bench import scaling

    def result(workload, workers):
        quarter = workload.endswith("actors")
        return {"work_s": 30.0 if quarter else 40.0, "wall_s": 50.0, "total_s": 45.0, "cpu_parallelism": 1.0,
                "loopback_bytes": 0, "effective_parallelism": 12.5 if quarter else 9.0}

    folders = {}
    rows, calls = _measured_on_16_cores(monkeypatch, "forest_actors", result=result, folders=folders)
    default, quarter = scaling.PAPER
    assert folders[default] == folders[quarter] and len(folders[default]) == 1
    assert calls[:3] == [(default, 16), (default, 16), (quarter, 16)]  # the default's untimed run first
    assert calls.count((default, 16)) == 4 and calls.count((quarter, 16)) == 3 and calls.count("down") == 3
    [r] = rows
    assert r["name"] == f"{quarter} vs {default}: 16 workers"
    quarter_side, default_side = r["quality"]["orchard"], r["quality"]["peer"]
    assert quarter_side["effective parallelism"] == 12.5 and default_side["effective parallelism"] == 9.0
    assert quarter_side["speed-up"] == pytest.approx(40 / 30)
    assert "forest.actors_per_worker=0.25" in scaling.run_overrides(quarter)
    assert "forest.actors_per_worker=0.25" not in scaling.run_overrides(default)


def test_a_workload_whose_run_fails_is_a_row_saying_why_and_the_others_go_on(monkeypatch):
    from bench import scaling

    class FakeCluster:
        address = "127.0.0.1:6379"

        def shutdown(self):
            pass

    def one_run(workload, workers, address, folder, smoke_sizes):
        if workload == "video":
            raise RuntimeError("video at 2 workers exited 1: no")
        return {"work_s": 2.0 / workers, "wall_s": 9.0, "total_s": 8.0, "cpu_parallelism": 1.0, "loopback_bytes": 0}

    monkeypatch.setattr(scaling.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(scaling, "start_cluster", lambda nodes, cpus: FakeCluster())
    monkeypatch.setattr(scaling, "one_run", one_run)
    rows = {r["name"]: r for r in scaling.measure({"workloads": ["video", "singa"], "smoke_sizes": True}, 1)}
    assert rows["video: workers and nodes"]["status"] == "failed on 1 node(s): video at 2 workers exited 1: no"
    assert rows["singa: 2 workers vs 1 worker"]["status"] == "ok"


def test_counts_double_up_to_the_cores():
    from bench.scaling import counts

    assert counts(1) == [1] and counts(2) == [1, 2] and counts(16) == [1, 2, 4, 8, 16] and counts(6) == [1, 2, 4, 6]


@pytest.mark.slow
def test_one_real_run_reports_its_work_parallelism_and_bytes(ray_session, tmp_path):
    """forest at debug=smoke attached to the session's Ray: its training seconds from the time
    split, its own effective parallelism, and the CPU its Ray processes used."""
    from bench import scaling

    address = attach_overrides()[1].split("=", 1)[1]
    r = scaling.one_run("forest", 2, address, tmp_path, smoke_sizes=True)
    assert 0 < r["work_s"] < r["total_s"] <= r["wall_s"]
    assert r["effective_parallelism"] > 0 and r["cpu_parallelism"] > 0 and r["loopback_bytes"] > 0
    # its rounds by phase, for the row's quality: where the worker count's time went
    assert r["phase2_s"] > 0 and r["phase3_s"] > 0 and r["between_phases_s"] >= 0
    quality = scaling.figures([r], 2, 1, [r], 2)
    assert quality["phase 2 s"] == r["phase2_s"] and quality["between phases s"] == r["between_phases_s"]
    # ... and its busy seconds by who was busy, and the phase-2 tasks that ran
    assert r["task_busy_s"] > 0 and r["actor_busy_s"] > 0 and r["phase2_tasks"] > 0
    assert quality["task busy s"] == r["task_busy_s"] and quality["phase-2 tasks"] == r["phase2_tasks"]
    assert 0 < r["driver_cpu_s"] == quality["driver cpu s"]   # the driver's share of the rounds
    # ... and the CPU seconds its Ray processes used, and how many of them it started (none, here:
    # the session's Ray already held every process the run used)
    assert r["cpu_s"] == pytest.approx(r["cpu_parallelism"] * r["wall_s"]) and isinstance(r["processes_started"], int)
    assert quality["cpu s"] == r["cpu_s"] and quality["ray processes started"] == r["processes_started"]


def test_the_ray_processes_a_run_started_are_counted_apart_from_those_before_it():
    """``RayProcessCpu.started``: a ``ray::`` process that appears after the tracker is made is
    counted as started by the run; one already running is not (its CPU before is not the run's)."""
    import subprocess
    import time

    import psutil

    from bench.scaling import RayProcessCpu

    def fake_ray_process():
        """A process titled as Ray's workers title themselves (argv[0] ``ray::<name>``), once it is."""
        proc = subprocess.Popen(["bash", "-c", 'exec -a "ray::FakeTask" sleep 30'])
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).cmdline()[:1] != ["ray::FakeTask"]:
            assert time.monotonic() < deadline, "bash did not exec the titled process"
            time.sleep(0.01)
        return proc

    before = fake_ray_process()
    try:
        cpu = RayProcessCpu()
        cpu.sample()
        assert before.pid not in cpu.started()
        during = fake_ray_process()
        try:
            cpu.sample()
            # the session's Ray may start a process of its own meanwhile: only these two are known
            assert during.pid in cpu.started() and before.pid not in cpu.started()
        finally:
            during.kill()
        during.wait()
        cpu.sample()  # it exited, as a run's processes do with its job: still one the run started
        assert during.pid in cpu.started()
    finally:
        before.kill()


def test_a_bench_stopped_part_way_keeps_its_finished_runs_and_writes_a_results_file_of_them(
        monkeypatch, tmp_path):
    """A lent machine's call ends at its time limit: the runs the bench finished before it was
    stopped are in its journal (bench/journal.py), and `python -m bench --from-runs` writes their
    rows, marked partial, with the measuring machine and the load its runs saw, on any machine."""
    import json
    import subprocess
    import sys

    from bench import journal, scaling
    from bench.machine import describe
    from tests.bench.test_runner import ROOT

    kept = journal.path_for(tmp_path, "scaling_forest_paper")
    journal.start(kept, {"bench": "scaling_forest_paper", "module": "bench.scaling", "size_name": "forest_paper",
                         "smoke": False, "repeats": 3, "command": "python -m bench scaling_forest_paper",
                         "rerun": "python -m bench scaling_forest_paper", "started_utc": "2026-12-06T04:00:00+00:00",
                         "machine": {**describe(), "cores": 16}, "load_before": {"load1": 0.2, "busy_cores": 0.1}})
    monkeypatch.setenv(journal.ENV, str(kept))
    calls = []

    def result(workload, workers):
        calls.append(workers)
        if len(calls) == 5:  # the second repeat's sixteen workers: the call's time is up
            raise KeyboardInterrupt
        return {"work_s": 40.0 / workers, "wall_s": 50.0, "total_s": 45.0, "cpu_parallelism": 1.0,
                "loopback_bytes": 0, "effective_parallelism": 0.8 * workers,
                "machine_cpu_s": 300.0 if workers == 16 else 100.0, "bench_cpu_s": 100.0}

    with pytest.raises(KeyboardInterrupt):
        _measured_on_16_cores(monkeypatch, "forest_paper", result=result)
    # the untimed run is not a result; the two four-worker runs and one sixteen-worker run are
    header, runs = journal.read(kept)
    assert [r["key"]["workers"] for r in runs] == [4, 16, 4] and header["machine"]["cores"] == 16
    with open(kept, "a") as f:  # a kill while a line was written leaves half a line: not a run
        f.write('{"key": {"workload": "forest paper", "wor')

    out = tmp_path / "results"
    done = subprocess.run([sys.executable, "-m", "bench", "--from-runs", str(kept), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    res = json.loads((out / "scaling_forest_paper.json").read_text())
    assert res["partial"].startswith("written from the 3 runs it finished") and res["error"] is None
    [r] = res["rows"]
    assert r["name"] == "forest paper: 16 workers vs 4 workers" and r["status"] == "ok"
    assert r["orchard"]["values"] == [2.5] and r["peer"]["values"] == [10.0, 10.0]
    assert r["quality"]["orchard"]["effective parallelism"] == 12.8 and res["machine"]["cores"] == 16
    # the load: 200 CPU-s of others over the sixteen workers' 50 s wall are 4 cores, under half of 16
    assert res["load"]["foreign_cores_max"] == 4.0 and res["load"]["loaded"] is False
    rendered = subprocess.run([sys.executable, "-m", "bench", "--render", "--out", str(out), "--doc",
                               str(tmp_path / "b.md")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    assert "Stopped part-way: written from the 3 runs" in (tmp_path / "b.md").read_text()

    # a row whose side never ran says so instead of a figure
    stopped = scaling.rows_from_runs(scaling.SIZES["forest_paper"], 16, runs[:1])
    assert stopped[0]["status"] == "not measured: the bench stopped before this side's runs"
    # refused in one line: no journal there, or a bench that keeps none
    missing = subprocess.run([sys.executable, "-m", "bench", "--from-runs", str(tmp_path / "none.runs.jsonl")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        f"bench: --from-runs: no such file: {tmp_path / 'none.runs.jsonl'}; allowed: a bench's journal, "
        "<results>/<bench>.runs.jsonl"]
    other = tmp_path / "flower_loader.runs.jsonl"
    journal.start(other, {**header, "bench": "flower_loader", "module": "bench.flower_loader"})
    refused = subprocess.run([sys.executable, "-m", "bench", "--from-runs", str(other), "--out", str(out)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "bench flower_loader keeps no runs" in refused.stderr
