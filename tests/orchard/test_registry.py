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


@pytest.mark.parametrize("name", ["flower", "forest", "singa", "video"])
def test_no_submodule_of_a_workload_shadows_its_contract(name):
    """Importing ``workloads.<name>.x`` sets the package's attribute ``x`` to the submodule: a
    contract function of the same name (video's ``dataset(cfg)`` beside a ``dataset.py`` once did)
    turns into a module as soon as any run imports it, and the core's call fails."""
    import importlib
    import inspect
    import pkgutil

    package = importlib.import_module(f"workloads.{name}")
    contract = {k for k, v in vars(package).items() if inspect.isfunction(v) and v.__module__ == package.__name__}
    for sub in pkgutil.iter_modules(package.__path__):
        assert sub.name not in contract, f"workloads/{name}/{sub.name}.py shadows workloads.{name}.{sub.name}()"
