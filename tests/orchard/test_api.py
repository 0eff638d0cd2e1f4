"""orchard/api.py, the one door: the workloads reach the core through it alone, and each name it
lists is there."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from orchard import api

ROOT = Path(__file__).resolve().parents[2]


def core_imports(folder: Path) -> list[tuple[str, str, list[str]]]:
    """``(file:line, module, names)`` of every import of an ``orchard`` module under ``folder``,
    at any depth of a file (inside functions too)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "orchard":
                found.append((where, node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                found += [(where, a.name, []) for a in node.names if a.name.split(".")[0] == "orchard"]
    return found


def test_the_workloads_import_the_core_through_the_door_alone():
    imports = core_imports(ROOT / "workloads")
    assert imports, "no core import found: the scan is broken"
    elsewhere = [f"{where}: {module}" for where, module, _ in imports if module != "orchard.api"]
    assert not elsewhere, "the workloads import the core past orchard.api:\n  " + "\n  ".join(elsewhere)
    unknown = [f"{where}: {name}" for where, _, names in imports for name in names if name not in api.DOOR]
    assert not unknown, "names orchard.api does not list:\n  " + "\n  ".join(unknown)


def test_the_scan_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    (tmp_path / "w.py").write_text("def f():\n    from orchard.storage import Storage\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert core_imports(tmp_path) == [("w.py:2", "orchard.storage", ["Storage"])]


@pytest.mark.parametrize("name", sorted(api.DOOR))
def test_every_name_of_the_door_is_where_it_says(name):
    module, _, attr = api.DOOR[name].partition(":")
    value = getattr(api, name)
    home = importlib.import_module(module)
    assert value is (getattr(home, attr) if attr else home)


def test_a_name_the_door_does_not_list_is_one_line_pointing_at_the_table():
    with pytest.raises(AttributeError, match="orchard.api.DOOR"):
        api.lifecycle  # noqa: B018 (the attribute access is the test)
