"""The core has no import circle, its wings import only wings below them, the workloads have no
circle either, and each core module imports alone.

The graph is read from the source with ``ast``: every ``import`` of an ``orchard`` module at
any depth of a file counts, inside functions too (a circle hidden in a function still ties
the two modules together: neither can be understood, moved or tested without the other).
Run as a script (``python tests/test_import_cycles.py``) it prints the graph's circles.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "orchard"


def module_names(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """``orchard.x.y`` -> its file, for every ``.py`` under the package (``__init__`` is the package)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The most specific known module that importing ``name`` runs (``orchard.x.func`` -> ``orchard.x``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that ``module`` imports anywhere in its file (itself excluded)."""
    is_package = path.name == "__init__.py"
    package = module.split(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .x import y
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                start = ".".join(base + ([node.module] if node.module else []))
            else:
                start = node.module or ""
            # `from orchard import config` imports the module orchard.config; `from orchard.x import f` imports orchard.x
            names = [f"{start}.{alias.name}" for alias in node.names] + [start]
        else:
            continue
        for name in names:
            if name == package or name.startswith(package + "."):
                target = _target(name, modules)
                if target and target != module:
                    found.add(target)
    # a module's own packages (`orchard`, `orchard.strategies` for launch.py) are imported before
    # it by Python itself; `from orchard import ConfigError` is no circle between two parts
    ancestors = {module.rsplit(".", k)[0] for k in range(1, module.count(".") + 1)}
    return found - ancestors


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(root, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan), as a path
    ``a -> b -> ... -> a`` found inside that component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle_in(component, graph) for component in components]


def _circle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest path from the component's first module back to itself (breadth first)."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return component  # unreachable: a component of more than one module always closes


def test_the_core_has_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles in orchard/ (imports inside functions count):\n" + "\n".join(
        "  " + " -> ".join(circle) for circle in found)


# orchard's wings, lowest first (docs/architecture.md): a wing imports only the wings before it and
# the top-level modules (errors, background, outcome). The terminal sits above config because
# every line it prints is masked by config/redact.py; sweeps sit below the run, which starts them.
WINGS = ("storage", "config", "terminal", "cluster", "tracking", "strategies", "models", "sweep", "run", "cli")


def wing_of(module: str) -> str | None:
    """``orchard.run.lifecycle`` -> ``run``; a top-level module (``orchard.errors``) -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in a higher wing than the importer's, as ``a -> b``."""
    found = []
    for module, targets in sorted(graph.items()):
        wing = wing_of(module)
        for target in sorted(targets):
            other = wing_of(target)
            if wing and other and WINGS.index(other) > WINGS.index(wing):
                found.append(f"{module} -> {target}")
    return found


def test_each_wing_imports_only_the_wings_below_it():
    wings = {p.name for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").is_file()}
    assert wings == set(WINGS), f"a wing missing from WINGS, or gone from orchard/: {sorted(wings ^ set(WINGS))}"
    up = upward_imports(import_graph())
    assert not up, "imports of a higher wing (WINGS, lowest first):\n  " + "\n  ".join(up)


def test_the_workloads_have_no_import_circle():
    found = cycles(import_graph(ROOT, "workloads"))
    assert not found, "import circles in workloads/:\n" + "\n".join("  " + " -> ".join(c) for c in found)


def test_the_graph_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The detector itself: a circle through a function-level and a relative import is found."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from orchard.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    (pkg / "c.py").write_text("import orchard.a\n")
    found = cycles(import_graph(tmp_path))
    assert found == [["orchard.a", "orchard.sub.b", "orchard.a"]]


@pytest.mark.slow
def test_each_core_module_imports_alone():
    """``python -c "import orchard.x"`` works for every module: one that only imports after
    another has been imported (an order effect one interpreter hides) fails here. One fresh
    interpreter per module, as many at a time as there are cores."""
    names = [n for n in module_names() if n != f"{PACKAGE}.__main__"]  # __main__ runs the CLI
    failures: list[str] = []
    running: list[tuple[str, subprocess.Popen]] = []

    def wait(name: str, proc: subprocess.Popen) -> None:
        _, err = proc.communicate(timeout=120)
        if proc.returncode:
            last = err.decode().strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            failures.append(f"{name}: {last[0]}")

    for name in names:
        running.append((name, subprocess.Popen([sys.executable, "-c", f"import {name}"], cwd=ROOT,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        if len(running) >= (os.cpu_count() or 2):
            wait(*running.pop(0))
    for item in running:
        wait(*item)
    assert not failures, "modules that do not import alone:\n  " + "\n  ".join(failures)


if __name__ == "__main__":
    for package in (PACKAGE, "workloads"):
        for circle in cycles(import_graph(ROOT, package)):
            print(" -> ".join(circle))
    print("\n".join(upward_imports(import_graph())))
