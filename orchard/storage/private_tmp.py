"""This user's own folder in the system temp folder (``<tmp>/orchard-<uid>``, mode 0700).

Ray's session folder, the node cache, the shipped copy of the checkout, the Ray Data logging
config and profiler traces go here, never to a folder every user of the machine can write.
Its own module, free of Ray: Ray workers' logging set-up (``ray_logging.py``) needs it too.
"""
from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path


def private_tmp() -> Path:
    """This user's own folder in the system temp folder (``orchard-<uid>``, 0700): Ray's session
    folder, the node cache, the shipped copy of the checkout. A folder of that name that is not
    ours (made by another user to read or plant our files) is not used: a fresh one is."""
    path = Path(tempfile.gettempdir()) / f"orchard-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            if st.st_mode & 0o077:
                path.chmod(0o700)
            return path
    except OSError:
        pass
    global _FALLBACK_TMP
    if _FALLBACK_TMP is None:
        _FALLBACK_TMP = Path(tempfile.mkdtemp(prefix=f"orchard-{os.getuid()}-"))
        print(f"orchard: {path} is not this user's own folder; using {_FALLBACK_TMP}", file=sys.stderr)
    return _FALLBACK_TMP


_FALLBACK_TMP: Path | None = None
