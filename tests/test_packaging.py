"""Every package that orchard and its workloads import is declared in pyproject's dependencies:
a package that only arrives as another's dependency may stop arriving."""
from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"orchard", "workloads", "bench", "tests"}


def top_level_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def declared() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def test_every_third_party_import_of_orchard_and_the_workloads_is_declared():
    owners = md.packages_distributions()
    missing = {}
    for name in sorted(top_level_imports(ROOT / "orchard") | top_level_imports(ROOT / "workloads")):
        if name in FIRST_PARTY or name in sys.stdlib_module_names or name.startswith("_"):
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(name, [])}
        if not dists & declared():
            missing[name] = sorted(dists) or ["(not installed)"]
    assert missing == {}, f"imported but not in pyproject's dependencies: {missing}"
