"""The registry imports lazily and accepts workloads from outside ``orchard/``."""
import sys

import pytest

from orchard.config import registry


def test_outside_workload_registered_from_tests_runs_through_prepare():
    from orchard.run.lifecycle import prepare

    cfg, module = prepare(["workload=tiny"])
    assert module.__name__ == "tests.tiny_workload"
    assert "tiny" in registry.names()


def test_builtin_workloads_are_listed_without_importing_them():
    for name in ("flower", "forest", "singa", "video"):
        assert name in registry.names()


def test_unknown_name_is_a_key_error():
    with pytest.raises(KeyError):
        registry.load("nope")


def test_a_builtin_workload_whose_extra_is_missing_is_a_config_error_naming_the_extra(monkeypatch):
    from orchard.errors import ConfigError

    monkeypatch.setitem(sys.modules, "numba", None)  # as if `pip install orchard` without [forest]
    with pytest.raises(ConfigError, match=r'workload=forest: needs pip install "orchard\[forest\]" \(not installed: numba\)'):
        registry.load("forest")
    assert registry.missing_extra("flower") == []  # installed here
    monkeypatch.setitem(registry._WORKLOADS, "forest", "tests.tiny_workload")  # the name taken by a module of one's own
    assert registry.missing_extra("forest") == []


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


def test_a_package_workload_runs_its_run_py_and_predicts_into_a_folder_made_whole(tmp_path, monkeypatch):
    """The anatomy's entry: ``run.py``'s ``run`` to train; ``predict.py``'s ``predict(cfg, ctx, out)``
    for mode=predict, ``out`` renamed to ``<run folder>/predictions`` only once it returned."""
    from types import SimpleNamespace

    pkg = tmp_path / "anatomy_workload"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("STRATEGIES = ('tasks',)\n")
    (pkg / "run.py").write_text("def run(cfg, ctx):\n    return {'trained': 1.0}\n")
    (pkg / "predict.py").write_text(
        "def predict(cfg, ctx, out):\n"
        "    (out / 'p.csv').write_text('x')\n"
        "    if cfg.get('fail'):\n        raise RuntimeError('half way')\n"
        "    return {'predicted': 1.0}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.register_workload("anatomy", "anatomy_workload")
    module = registry.load("anatomy")
    ctx = SimpleNamespace(run_dir=str(tmp_path / "run"))
    assert registry.entry(module, "train")({}, ctx) == {"trained": 1.0}
    with pytest.raises(RuntimeError):
        registry.entry(module, "predict")({"fail": True}, ctx)
    assert not (tmp_path / "run" / "predictions").exists()  # no partial folder
    assert registry.entry(module, "predict")({}, ctx) == {"predicted": 1.0}
    assert (tmp_path / "run" / "predictions" / "p.csv").read_text() == "x"
    for name in ("anatomy_workload", "anatomy_workload.run", "anatomy_workload.predict"):
        sys.modules.pop(name, None)


ROLES = ("run", "data", "model", "train", "evaluate", "predict", "figures", "checkpoint")


@pytest.mark.parametrize("name", ["flower", "forest", "singa", "video"])
def test_every_workload_has_the_anatomy_and_no_module_imports_back_from_its_init(name):
    """The anatomy (docs/architecture.md): the same file for the same role in each workload, ``run.py`` the entry
    the core calls (``run``), ``predict.py`` the one for mode=predict (``predict``); a module may
    import its package's submodules, never what the package's ``__init__.py`` defines."""
    import ast
    import importlib
    import inspect
    import pkgutil
    from pathlib import Path

    package = importlib.import_module(f"workloads.{name}")
    folder = Path(package.__file__).parent
    assert [r for r in ROLES if not (folder / f"{r}.py").is_file()] == []
    assert list(inspect.signature(importlib.import_module(f"workloads.{name}.run").run).parameters) == ["cfg", "ctx"]
    assert list(inspect.signature(importlib.import_module(f"workloads.{name}.predict").predict).parameters) == [
        "cfg", "ctx", "out"]
    submodules = {m.name for m in pkgutil.iter_modules([str(folder)])}
    back = []
    for path in folder.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == folder:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            into_init = node.module == f"workloads.{name}" or (node.level == 1 and node.module is None
                                                                and path.parent == folder)
            if into_init:
                back += [f"{path.relative_to(folder)}: {a.name}" for a in node.names if a.name not in submodules]
    assert back == [], f"imports from workloads/{name}/__init__.py: {back}"
