"""The benchmark runner (python -m bench, bench/runner.py) as a user drives it: one bench at smoke
size into a results folder with the machine, the load and the rows, rendered to Markdown that
never says "met" for a smoke run; bad arguments refused in one line. Each bench's own code is
tested in tests/bench/test_<bench module>.py. Timings are never asserted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import BENCHES, EXTRA_BENCHES
from bench.rows import ABSENT

ROOT = Path(__file__).resolve().parents[2]


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
def test_a_bench_at_smoke_size_writes_its_results_file_and_the_markdown(tmp_path):
    """The harness on its quickest bench (flower_loader, seconds): the same command, machine and
    load records and row checks that every bench's results file gets."""
    done = bench_cli("flower_loader", "--smoke", "--out", str(tmp_path), "--render", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    res = json.loads((tmp_path / "flower_loader.json").read_text())
    assert res["smoke"] is True and res["repeats"] == 1 and res["error"] is None
    assert not (tmp_path / "flower_loader.runs.jsonl").exists()  # a bench that ended keeps no journal
    assert res["command"] == f"python -m bench flower_loader --smoke --out {tmp_path} --render"
    m = res["machine"]
    assert m["cores"] >= 1 and m["cpu_model"] and m["memory_gib"] > 0 and len(m["git_commit"]) == 40
    assert m["versions"]["ray"] == "2.60.0" and m["torch"].startswith("2.")
    assert {"before", "during", "after", "loaded", "foreign_cores_max"} <= set(res["load"])
    assert res["rows"]
    for r in res["rows"]:
        if r["status"].startswith(ABSENT):  # a peer that cannot run here says why
            continue
        assert r["status"] == "ok", (r["name"], r["status"])
        assert len(r["orchard"]["values"]) == 1 and r["orchard"]["median"] > 0, r["name"]
        assert r["peer"]["median"] > 0 and r["ratio"] > 0 and r["quality"]["orchard"] and r["quality"]["peer"], r["name"]
    # the loader's batches are the peer's: output equality beside the speed
    loader = [r for r in res["rows"] if r["name"].startswith("flower loader")]
    assert loader and all(r["quality"]["peer"]["first batch"] == "equal to orchard's" for r in loader)
    assert not [p for p in tmp_path.glob("*.json") if p.name != "flower_loader.json"]  # only the bench named
    text = (tmp_path / "benchmarks.md").read_text()
    assert "smoke size: not a result" in text and ": met" not in text
