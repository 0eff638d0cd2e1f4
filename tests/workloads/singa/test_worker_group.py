"""workloads/singa/worker_group.py on many nodes (issue 16): worker groups on two Ray nodes reach each other at their node's
address and train exactly as on one node.  ``ray.cluster_utils.Cluster`` needs a Ray of its own,
so the run happens in a subprocess (two_node_cluster.py), beside the session's Ray."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


@pytest.mark.slow
def test_sync_ps_and_allreduce_on_two_nodes_equal_the_one_node_run(tmp_path):
    env = dict(os.environ)
    # the repo (workloads/) and the user's layer package, for the driver and every node's workers
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "fixtures" / "user_layers"),
                                         env.get("PYTHONPATH", "")])
    env.pop("RAY_ADDRESS", None)
    # A Cluster announces itself in <RAY_TMPDIR>/ray/ray_current_cluster, where any plain
    # ray.init() on this machine would find and join it: keep it in a folder of its own (short,
    # for Ray's socket paths).
    private = tempfile.mkdtemp(prefix="singa2n", dir="/tmp")
    env["RAY_TMPDIR"] = private
    try:
        proc = subprocess.run([sys.executable, str(HERE / "two_node_cluster.py")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cluster_nodes"] == 2
    for name in ("sync_ps", "allreduce"):
        one, two = out["one_node"][name], out["two_nodes"][name]
        assert len(set(one["nodes"])) == 1 and len(set(two["nodes"])) == 2, (name, two["nodes"])  # a group per node
        for key in one["params"]:
            np.testing.assert_allclose(two["params"][key], one["params"][key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} {key}")
        assert two["accuracy"] == pytest.approx(one["accuracy"])
        assert "act1/a" in two["params"]  # the user's layer trained on both nodes
    for run in (out["one_node"]["allreduce"], out["two_nodes"]["allreduce"]):
        host = run["rendezvous"][0]
        # the rendezvous is group 0's node address as Ray knows it, never a loopback
        assert host == run["node_ips"][0] and not host.startswith("127.")
    # sync_ps and allreduce apply the same averaged SGD step: the same parameters
    a, b = out["two_nodes"]["sync_ps"]["params"], out["two_nodes"]["allreduce"]["params"]
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-5, err_msg=key)
