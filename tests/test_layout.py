"""The tests mirror the code (docs/architecture.md): ``tests/orchard/<wing>/test_<module>.py`` and
``tests/workloads/<name>/test_<role>.py`` each name the module they test, so "where are X's tests"
is answered from the tree alone. A test file named for a behaviour instead fails here, naming it."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: Path) -> set[str]:
    """The names a test file may carry in ``package``'s test folder: its modules and subpackages,
    and the package's own name for its ``__init__``."""
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return names | {package.name}


def _strays(tests: Path, package: Path, root: Path = ROOT) -> list[str]:
    return [str(t.relative_to(root)) for t in sorted(tests.glob("test_*.py"))
            if t.stem[len("test_"):] not in _modules(package)]


def test_each_core_test_file_names_the_module_it_tests():
    strays = _strays(ROOT / "tests" / "orchard", ROOT / "orchard")
    for wing in sorted(p for p in (ROOT / "tests" / "orchard").iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (ROOT / "orchard" / wing.name / "__init__.py").is_file(), f"tests/orchard/{wing.name}: no such wing"
        strays += _strays(wing, ROOT / "orchard" / wing.name)
    assert not strays, f"test files named for no module of the core: {strays}"


def test_each_workload_test_file_names_the_role_it_tests():
    strays = []
    for folder in sorted(p for p in (ROOT / "tests" / "workloads").iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (ROOT / "workloads" / folder.name / "__init__.py").is_file(), f"tests/workloads/{folder.name}: no such workload"
        strays += _strays(folder, ROOT / "workloads" / folder.name)
    assert not strays, f"test files named for no module of their workload: {strays}"


def test_a_test_file_named_for_a_behaviour_is_caught(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "data.py", "sub/__init__.py"):
        (package / name).write_text("")
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("test_data.py", "test_sub.py", "test_pkg.py", "test_bad_data.py"):
        (tests / name).write_text("")
    assert _strays(tests, package, tmp_path) == ["tests/test_bad_data.py"]
