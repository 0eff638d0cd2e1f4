"""What `pip install orchard` and its extras bring: the core's dependencies are what orchard/
imports, each workload's extra (`orchard[flower]`, ...) adds what that workload imports, and the
core imports and answers without any extra (a workload whose extra is missing is refused in one
line naming it). Every package imported is declared: one that only arrives as another's
dependency may stop arriving."""
from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from orchard.config.registry import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"orchard", "workloads", "bench", "tests"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
WORKLOADS = sorted(EXTRAS)
# every workload's own packages, by import name: what the core must import without
EXTRA_IMPORTS = sorted({name for names in EXTRAS.values() for name in names})


def top_level_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def distributions(requirements: list[str]) -> set[str]:
    """The distribution names a requirement list names, extras of orchard itself expanded."""
    out = set()
    for req in requirements:
        name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name == "orchard":
            for extra in re.search(r"\[(.*)\]", req).group(1).split(","):
                out |= distributions(PYPROJECT["optional-dependencies"][extra.strip()])
        else:
            out.add(name)
    return out


def undeclared(folder: Path, declared: set[str]) -> dict[str, list[str]]:
    owners = md.packages_distributions()
    missing = {}
    for name in sorted(top_level_imports(folder)):
        if name in FIRST_PARTY or name in sys.stdlib_module_names or name.startswith("_"):
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(name, [])}
        if not dists & declared:
            missing[name] = sorted(dists) or ["(not installed)"]
    return missing


def test_every_third_party_import_of_the_core_is_a_core_dependency():
    # but torch: the Ray Train worker (orchard/strategies/worker.py) and lazy imports in the code the
    # torch workloads call (optimizers, divergence); it comes with each extra that reaches them, and
    # the rest of the core imports without it (test_every_core_module_..._import_without_torch)
    torch_workloads = distributions(PYPROJECT["optional-dependencies"]["flower"]) & distributions(
        PYPROJECT["optional-dependencies"]["video"]) & distributions(PYPROJECT["optional-dependencies"]["singa"])
    assert "torch" in torch_workloads
    assert undeclared(ROOT / "orchard", distributions(PYPROJECT["dependencies"]) | {"torch"}) == {}, \
        "orchard/ imports it, but pyproject's dependencies do not declare it"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_third_party_import_of_a_workload_is_in_the_core_or_its_extra(workload):
    declared = distributions(PYPROJECT["dependencies"]) | distributions(PYPROJECT["optional-dependencies"][workload])
    assert undeclared(ROOT / "workloads" / workload, declared) == {}, \
        f'workloads/{workload}/ imports it, but neither the core nor orchard[{workload}] declares it'


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_registrys_extras_are_pyprojects(workload):
    """orchard/config/registry.py's EXTRAS (what it checks before a run) name packages of the
    workload's extra, and the extra has no package the workload does not import."""
    owners = md.packages_distributions()
    extra = distributions(PYPROJECT["optional-dependencies"][workload])
    checked = {d.lower().replace("_", "-") for name in EXTRAS[workload] for d in owners.get(name, [])}
    assert checked == extra


def test_all_is_every_workload_and_dev_brings_all_so_readmes_install_runs_the_suite():
    assert distributions(["orchard[all]"]) == set().union(
        *(distributions(PYPROJECT["optional-dependencies"][w]) for w in WORKLOADS))
    assert "orchard[all]" in PYPROJECT["optional-dependencies"]["dev"]
    assert not {"torch", "numba", "av"} & distributions(PYPROJECT["dependencies"])


def run_without(packages: list[str], args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`python args` in a process where importing any of `packages` fails as if not installed."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import sys
        BLOCKED = {set(packages)!r}
        class NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, NotInstalled())
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_core_imports_and_its_cli_answers_without_any_workloads_extra(tmp_path):
    proc = run_without(EXTRA_IMPORTS, ["-c", "import orchard, orchard.api, orchard.cli; import torch"], tmp_path)
    assert "No module named 'torch'" in proc.stderr and "orchard" not in proc.stderr.split("import torch")[0]
    proc = run_without(EXTRA_IMPORTS, ["-m", "orchard", "--help"], tmp_path)
    assert proc.returncode == 0 and "workload=" in proc.stdout, proc.stderr


def test_every_core_module_and_the_forests_import_without_torch(tmp_path):
    """Only Ray Train's side of orchard needs the torch workloads' extras: the worker
    (orchard/strategies/worker.py) torch, the process group's setup (process_group.py) Ray Train,
    whose pandas comes with them (Ray raises a bare ImportError: no name); the forest needs its own
    extra (numba, OpenCV) and none of the others'."""
    script = textwrap.dedent("""
        import importlib, pkgutil
        import orchard, workloads.forest
        failed = {}
        for package in (orchard, workloads.forest):
            for m in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                if not m.name.endswith("__main__"):
                    try:
                        importlib.import_module(m.name)
                    except ImportError as e:
                        failed[m.name] = e.name
        print(sorted(failed.items()))
    """)
    others = sorted(set(EXTRA_IMPORTS) - set(EXTRAS["forest"]))
    proc = run_without(others, ["-c", script], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[('orchard.strategies.process_group', None), ('orchard.strategies.worker', 'torch')]"


def test_a_workload_whose_extra_is_missing_is_refused_in_one_line_naming_it(tmp_path):
    proc = run_without(["av"], ["-m", "orchard", "workload=video", "tracking=none"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        'orchard: bad config: workload=video: needs pip install "orchard[video]" (not installed: av)'
