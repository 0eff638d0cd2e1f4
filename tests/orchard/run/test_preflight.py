"""orchard/run/preflight.py: what is refused before a run starts anything: Ray without its token auth,
here and on a cluster off this machine."""
from __future__ import annotations

import subprocess

import pytest


def test_ray_without_its_token_is_refused_unless_allowed(monkeypatch, capsys, tmp_path):
    """Ray keeps its token only while RAY_AUTH_MODE is unset or exactly ``token``."""
    from orchard import cli
    from orchard.errors import ConfigError
    from orchard.run.preflight import _check_ray_auth

    for mode in ("disabled", "off", "none", "Token", ""):
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
        with pytest.raises(ConfigError) as refused:
            _check_ray_auth({"mode": "local"})
        assert refused.value.key == "cluster.allow_unauthenticated"
        _check_ray_auth({"mode": "local", "allow_unauthenticated": True})  # meant: an isolated network
    monkeypatch.setenv("RAY_AUTH_MODE", "off")  # the CLI: one line, exit 2, before Ray starts
    with pytest.raises(SystemExit) as ended:
        cli.main(["workload=tiny", "tracking=none", f"output_dir={tmp_path}"])
    assert ended.value.code == 2 and "RAY_AUTH_MODE='off'" in capsys.readouterr().err
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    _check_ray_auth({"mode": "local"})
    monkeypatch.delenv("RAY_AUTH_MODE")
    _check_ray_auth({"mode": "local"})


OPEN_HEAD = r"""
import sys
from ray.cluster_utils import Cluster

head = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0})
print(head.address, flush=True)
sys.stdin.read()   # up until the test closes our stdin
head.shutdown()
"""


@pytest.mark.slow
def test_attaching_to_a_cluster_without_token_auth_is_refused_off_this_machine(ray_session, monkeypatch, capsys):
    """Issue 30: a cluster whose head runs without Ray's token answers anyone; orchard refuses to
    attach to one on another machine (one line naming cluster.allow_unauthenticated), says so in
    one line for one on this machine, and is silent for a cluster with auth on."""
    import os
    import sys

    from orchard.run import preflight
    from orchard.errors import ConfigError

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    head = subprocess.Popen([sys.executable, "-c", OPEN_HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=env, text=True)
    try:
        address = head.stdout.readline().strip()
        assert address, "the auth-less head did not start"
        preflight.check_gcs(address, {})
        assert "runs without token auth" in capsys.readouterr().err
        monkeypatch.setattr(preflight, "_on_this_machine", lambda host: False)
        with pytest.raises(ConfigError) as err:
            preflight.check_gcs(address, {})
        assert err.value.key == "cluster.allow_unauthenticated" and "without token auth" in str(err.value)
        preflight.check_gcs(address, {"allow_unauthenticated": True})   # said on purpose
        # the test session's Ray started with auth on (Ray 2.60's default for ray.init): not a word
        preflight.check_gcs(ray_session.get_runtime_context().gcs_address, {})
        assert capsys.readouterr().err == ""
    finally:
        head.stdin.close()
        head.wait(timeout=120)


@pytest.mark.parametrize("address, probed", [("ray://head.example", ("head.example", 10001)),
                                             ("ray://head.example:4321/", ("head.example", 4321)),
                                             ("head.example:6380", ("head.example", 6380))])
def test_an_address_without_a_port_is_probed_at_rays_own(address, probed, monkeypatch):
    """Ray Client's port (10001) for ``ray://host``, as Ray takes it; the probe's line names the
    address as given (it read 'invalid literal for int()' for ``ray://host``)."""
    from orchard.errors import ConfigError
    from orchard.run import preflight

    tried = []

    def refuse(target, timeout):
        tried.append(target)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(preflight.socket, "create_connection", refuse)
    with pytest.raises(ConfigError) as err:
        preflight._check_cluster_address(address, {})
    assert tried == [probed]
    assert str(err.value) == f"cluster.address: a Ray cluster that answers; none did at {address} (Connection refused)"
