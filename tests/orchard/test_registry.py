"""The registry imports lazily and accepts workloads from outside ``orchard/``."""
import sys

import pytest

from orchard import registry


def test_outside_workload_registered_from_tests_runs_through_prepare():
    from orchard.lifecycle import prepare

    cfg, module = prepare(["workload=tiny"])
    assert module.__name__ == "tests.tiny_workload"
    assert "tiny" in registry.names()


def test_builtin_workloads_are_listed_without_importing_them():
    for name in ("flower", "forest", "singa", "video"):
        assert name in registry.names()


def test_unknown_name_is_a_key_error():
    with pytest.raises(KeyError):
        registry.load("nope")


def test_module_without_run_is_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "halfdone_workload.py"
    pkg.write_text("STRATEGIES = ('ring',)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.register_workload("halfdone", "halfdone_workload")
    with pytest.raises(TypeError):
        registry.load("halfdone")
    sys.modules.pop("halfdone_workload", None)
