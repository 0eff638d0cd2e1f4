"""workloads/forest/jit.py: kernels cached by their package's content. A copy of the same package
at another path (what a job's working_dir is on each new cluster) finds them compiled; a change
to any of its files compiles them anew. Each side is a fresh process, as a Ray worker is."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

INIT = """
from pathlib import Path
from workloads.forest.jit import cache_by_content
cache_by_content(__package__, Path(__file__).parent)
"""
KERNEL = """
import numba

@numba.njit(cache=True)
def total(xs):
    s = 0.0
    for x in xs:
        s += x
    return s
"""
HELPER = "SCALE = 1\n"
CALL = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from kernelpkg.kernels import total
assert total(np.arange(4.0)) == 6.0
print(json.dumps({"hits": sum(total.stats.cache_hits.values()), "misses": sum(total.stats.cache_misses.values()),
                  "folder": total._cache._cache_path}))
"""


def _package(root: Path) -> Path:
    pkg = root / "kernelpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(INIT))
    (pkg / "kernels.py").write_text(textwrap.dedent(KERNEL))
    (pkg / "helpers.py").write_text(HELPER)
    return root


def _call(root: Path, cache: Path) -> dict:
    env = {"PATH": "/usr/bin:/bin", "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CALL, str(root)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_copy_of_the_package_elsewhere_finds_its_kernels_compiled(tmp_path):
    cache = tmp_path / "cache"
    first = _call(_package(tmp_path / "extracted-1"), cache)
    assert first["misses"] == 1 and first["hits"] == 0
    assert Path(first["folder"]).parent == cache and Path(first["folder"]).name.startswith("kernelpkg-")

    copy = tmp_path / "extracted-2"  # another path, the same bytes: numba's own key (the path) misses
    shutil.copytree(tmp_path / "extracted-1", copy)
    again = _call(copy, cache)
    assert again == {**first, "misses": 0, "hits": 1}

    # a neighbour's change (kernels inline their neighbours' helpers): compiled anew, in a new folder
    (copy / "kernelpkg" / "helpers.py").write_text("SCALE = 2\n")
    changed = _call(copy, cache)
    assert changed["misses"] == 1 and changed["folder"] != first["folder"]


def test_the_forest_kernels_are_cached_by_content_where_a_cache_folder_is_named(tmp_path):
    code = ("import workloads.forest.histogram_kernels as h, workloads.forest.model as m;"
            "print(type(h.assign_nodes._cache._impl.locator).__name__, type(m.predict_pixels._cache._impl.locator).__name__)")

    def locators(**env):
        base = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**base, **env})
        return done.stdout.split() or done.stderr[-2000:]

    assert locators(NUMBA_CACHE_DIR=str(tmp_path)) == ["PackageContentLocator"] * 2
    # no folder named (a cluster's node that did not ask): numba's default, beside the sources
    assert locators() == ["InTreeCacheLocator"] * 2
