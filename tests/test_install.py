"""A newcomer's install: README's first command block is what CI runs, needs no wheel folder of
this machine's, says where the CPU-only torch comes from, and CI's torch check takes any build
that works (a CUDA build on a machine without a GPU too)."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _quickstart_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quickstart"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_readmes_first_block_is_cis_install_and_needs_no_local_wheels():
    first = _quickstart_blocks()[0]
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]"' in first and 'pip install -q -e ".[dev]"' in ci
    assert "python -m pytest" in first and "python -m pytest" in ci
    for local in ("/opt/", "find-links", "file://"):
        assert local not in first and local not in ci
    assert "python .ci/check_torch.py" in ci


def test_readme_says_where_the_cpu_only_torch_comes_from_and_which_torch_is_tested():
    from packaging.specifiers import SpecifierSet

    blocks = "\n".join(_quickstart_blocks())
    tested = re.search(rf"pip install torch==([\d.]+) --index-url {CPU_INDEX}", blocks).group(1)
    pyproject = (ROOT / "pyproject.toml").read_text()
    ranges = set(re.findall(r'"torch(>=[\d.]+,<[\d.]+)"', pyproject))
    assert len(ranges) == 1  # one range for every extra that brings torch, with a floor and a ceiling
    assert tested in SpecifierSet(ranges.pop())  # the README's version is inside it
    assert f"tested with {tested}" in pyproject  # and is the one pyproject says CI tests
    assert f"tested with {tested}" in (ROOT / "README.md").read_text()


def test_cis_torch_check_accepts_a_cuda_build_on_a_machine_without_a_gpu(tmp_path):
    # PyPI's CUDA wheel cannot be installed here (GBs, no index): a stand-in with its version and
    # what torch.cuda says on a machine without a GPU; its kernel is a plain product
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent("""
        from types import SimpleNamespace
        __version__ = "2.13.0+cu128"
        version = SimpleNamespace(cuda="12.8")
        cuda = SimpleNamespace(is_available=lambda: False)
        class _Vector(list):
            def __matmul__(self, other):
                return float(sum(a * b for a, b in zip(self, other)))
        def ones(n):
            return _Vector([1.0] * n)
    """))
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "check_torch.py")], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "torch 2.13.0+cu128: CUDA 12.8 build, no GPU visible, runs on the CPU"
