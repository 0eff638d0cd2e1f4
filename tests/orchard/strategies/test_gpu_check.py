"""orchard/strategies/gpu_check.py: a run whose workers would hold GPUs that their torch cannot see
ends in one line naming ``strategy.gpus_per_worker`` before a Train group starts; a cluster with
no GPU free is left to Ray Train's own start bound."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_node_loss import start_cluster

REPO = Path(__file__).resolve().parents[3]
torch = pytest.importorskip("torch")
cpu_torch = pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU here")


@cpu_torch
def test_an_embedded_ray_whose_torch_sees_no_gpu_is_refused_naming_the_key():
    from orchard.errors import ConfigError
    from orchard.strategies.gpu_check import check_gpus_usable

    with pytest.raises(ConfigError) as err:
        check_gpus_usable(1.0, embedded=True)
    assert err.value.key == "strategy.gpus_per_worker"
    assert f"torch {torch.__version__}" in str(err.value) and "no CUDA device" in str(err.value)


def test_a_cluster_without_a_free_gpu_is_left_to_ray_trains_start_bound(ray_session):
    """The session's Ray declares no GPU: the probe cannot be placed, gives up after its wait and
    raises nothing (Ray Train's bound on the group's start then ends the run, as before)."""
    from orchard.strategies.gpu_check import check_gpus_usable

    assert check_gpus_usable(0.5, embedded=False, wait_s=1.0) is None


# a one-node cluster that declares a GPU this CPU machine does not have, as a GPU node with the
# CPU wheel of torch looks to Ray; it lives until the test closes its stdin
CLUSTER = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2, "num_gpus": 1})
print("ADDRESS", cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


@pytest.fixture
def gpu_node():
    """The cluster above, started and shut down by the node-loss tests' helper."""
    yield from start_cluster(CLUSTER)


@pytest.mark.slow
@cpu_torch
def test_a_flower_run_on_a_gpu_node_whose_torch_has_no_cuda_ends_in_one_line_exit_2(gpu_node, tmp_path):
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = subprocess.run([sys.executable, "-m", "orchard", "workload=flower", "debug=smoke", "progress=never",
                           "strategy.num_workers=1", "strategy.gpus_per_worker=0.5", "cluster=remote",
                           f"cluster.address={gpu_node.address}", f"tracking.uri={uri}", f"output_dir={tmp_path}/out"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    said = [ln for ln in done.stderr.splitlines() if "bad config" in ln]
    assert len(said) == 1 and "strategy.gpus_per_worker" in said[0] and "no CUDA device" in said[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "pin_memory" not in done.stderr
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED" and "strategy.gpus_per_worker" in run.data.tags["orchard.error"]
