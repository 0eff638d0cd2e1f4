"""The forest's kernels compile with ``numba.njit`` through here, cached by this package's content
in a named cache folder (orchard.api.cache_kernels_by_content): a run on a fresh cluster whose nodes
name one (``NUMBA_CACHE_DIR``), its workers importing the package from a newly extracted copy,
finds them compiled instead of compiling for ~11 s."""
from __future__ import annotations

from pathlib import Path

import numba

from orchard.api import cache_kernels_by_content

cache_kernels_by_content(__package__, Path(__file__).parent)
njit = numba.njit
