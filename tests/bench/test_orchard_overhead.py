"""bench/orchard_overhead.py's two sides do the work they claim: the first-step workload runs
through orchard's CLI and lands its metric in the store, and every metric logged through the sink,
plain MLflow and MLflow's async queue is found in the store afterwards."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.session_ray import attach_overrides

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_first_step_workload_runs_through_the_cli_and_its_metric_is_stored(ray_session, tmp_path):
    from bench import orchard_overhead as oh

    conf = tmp_path / "conf" / "workload"
    conf.mkdir(parents=True)
    (conf / "bench_first_step.yaml").write_text(oh.WORKLOAD_YAML)
    uri = f"sqlite:///{tmp_path}/orchard.db"
    code = oh.ORCHARD_CMD.format(repo=str(ROOT), conf=str(tmp_path / "conf"))
    seconds = oh.time_to_first_step(code, ["workload=bench_first_step", f"tracking.uri={uri}", *attach_overrides()],
                                    tmp_path)
    assert seconds > 0 and oh.metric_found(uri) == "1/1"


PER_CALL = "import json, sys; from pathlib import Path; from bench.orchard_overhead import per_step_overhead; " \
           "print(json.dumps(per_step_overhead(Path(sys.argv[1]), 20)))"


@pytest.mark.slow
def test_every_metric_each_side_logs_is_in_the_store_afterwards(tmp_path):
    # its own process: the bench starts and stops a Ray of its own, as it does when measuring
    done = subprocess.run([sys.executable, "-c", PER_CALL, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["orchard_found"] == got["async_found"] == "20/20" and got["mlflow_found"] == "10/10", got
    assert got["orchard_us"] > 0 and got["mlflow_us"] > 0 and got["async_us"] > 0
