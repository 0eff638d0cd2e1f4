"""cluster=remote attaches to an existing Ray cluster with no other change: a separate driver
process attaches to the test session's running cluster, ships this checkout as its working
dir, runs a workload there, and leaves the cluster running."""
import subprocess

import pytest

from tests.tiny_workload.cli import tiny_cli, tiny_cli_env



@pytest.mark.slow
def test_remote_mode_attaches_to_a_running_cluster(ray_session, tmp_path):
    from mlflow.tracking import MlflowClient

    address = ray_session.get_runtime_context().gcs_address
    nodes_before = len(ray_session.nodes())
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.run(tiny_cli("workload=tiny", "cluster=remote", f"cluster.address={address}",
                           "tiny.steps=5", f"tracking.uri={uri}", f"output_dir={tmp_path}/out"),
                          cwd=tmp_path, env=tiny_cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["cluster.mode"] == "remote"
    assert len(client.get_metric_history(runs[0].info.run_id, "worker/loss")) == 5  # ran in the cluster's workers
    # the attached driver left the cluster as it found it
    assert ray_session.is_initialized() and len(ray_session.nodes()) == nodes_before
    assert ray_session.get(ray_session.remote(lambda: 42).remote()) == 42
