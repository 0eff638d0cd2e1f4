"""The forest's kernels compile with ``numba.njit`` through here (``njit``), their cache keyed by
what this package holds, not by where its files sit.

numba keys its cache folder on the source file's directory path (``<dir>/__pycache__``, or
``NUMBA_CACHE_DIR/<dir name>_<sha1 of the path>``). A worker of an attached cluster imports the
workloads from the job's working_dir, which Ray extracts under the session's folder: every new
cluster (and every node's first job) has a new path, so the forest's kernels compiled again in
the first run on each cluster, ~11 s of its training split on 2 cores (a mid-shape forest on a
fresh one-node cluster: 27.0 s, then 15.6 s and 16.0 s; 2026-12-03).

``cache_by_content(package, folder)`` keys the cache of a package's kernels on its name and a hash
of all its ``.py`` files instead: any copy of the same sources (another cluster, another
node's extraction, another checkout) finds the kernels compiled, and a change to any file of
the package (a kernel inlines helpers from its neighbours, which numba's own per-file check
does not see) compiles them anew. numba still checks each file's content stamp in its index.

Only where a cache folder is named: ``NUMBA_CACHE_DIR`` (numba's own variable), which orchard
sets for the processes of the Ray it starts (``$XDG_CACHE_HOME/orchard/numba``, in
``orchard.cluster.prepare_local_env``) and a cluster's operator sets on its nodes to keep compiled
kernels across clusters. Without it, on an attached cluster, numba keeps its default (``__pycache__`` beside the
extracted copy, gone with the session): orchard does not write into a node's home folder unasked.
Unwritable, numba's own locators decide; other packages' kernels keep numba's default.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numba

_PACKAGES: dict[str, Path] = {}  # package name -> its folder, for the packages that asked


def cache_root() -> Path | None:
    """The cache folder named on this node (``NUMBA_CACHE_DIR``, or numba's config read from
    it), or None."""
    from numba.core import config

    named = os.environ.get("NUMBA_CACHE_DIR") or getattr(config, "CACHE_DIR", "")
    return Path(named) if named else None


@functools.lru_cache(maxsize=None)
def package_digest(folder: str) -> str:
    """A hash of the names and bytes of the package's ``.py`` files (once per process)."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*.py")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def _numba_caching(name: str):
    """A class of numba's cache machinery; numba 0.68 dropped the leading underscore of these names."""
    from numba.core import caching

    return getattr(caching, name, None) or getattr(caching, "_" + name)


class PackageContentLocator(_numba_caching("UserProvidedCacheLocator")):
    """numba's user-folder locator, with the folder named by package and content."""

    def __init__(self, py_func, py_file, package: str, root: Path):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(root / f"{package}-{package_digest(str(_PACKAGES[package]))}")

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        module = getattr(py_func, "__module__", "") or ""
        package = next((p for p in _PACKAGES if module == p or module.startswith(p + ".")), None)
        root = cache_root()
        if package is None or root is None or not os.path.exists(py_file):
            return None
        self = cls(py_func, py_file, package, root)
        try:
            self.ensure_cache_path()
        except OSError:  # not writable here: numba's own locators decide
            return None
        return self


def cache_by_content(package: str, folder: str | os.PathLike) -> None:
    """Cache the kernels of ``package`` (its modules' ``cache=True`` functions, decorated after
    this call) by the package's content; ``folder`` is the package's directory."""
    _PACKAGES[package] = Path(folder)
    locators = _numba_caching("CacheImpl")._locator_classes
    if PackageContentLocator not in locators:  # first, once per process
        locators.insert(0, PackageContentLocator)


cache_by_content(__package__, Path(__file__).parent)
njit = numba.njit
