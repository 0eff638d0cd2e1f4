"""orchard/storage/atomic.py: writes that survive a full disk and a kill, and a node cache that stays
under its bound. The disk-full case is the kernel's own refusal: a child process whose file-size
limit (RLIMIT_FSIZE) is below the file it writes gets EFBIG from write(2), as a full disk gives
ENOSPC; no root, no tmpfs needed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from orchard.storage import clean_partials, partial_name, StorageFull, write_atomic

_CHILD_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def test_a_write_the_disk_refuses_keeps_the_previous_file_and_says_one_line(tmp_path):
    store = tmp_path / "run"
    (store / "ckpt").mkdir(parents=True)
    (store / "ckpt" / "model.npz").write_bytes(b"good checkpoint")
    child = textwrap.dedent(f"""
        import resource, signal, sys
        from orchard.storage import Storage, StorageFull
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)           # EFBIG from write(2) instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        try:
            Storage({str(store)!r}).write_bytes("ckpt/model.npz", b"x" * 1_000_000)
        except StorageFull as exc:
            print(exc)
            sys.exit(3)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=_CHILD_ENV, timeout=120)
    assert done.returncode == 3, done.stderr
    line = done.stdout.strip()
    assert "\n" not in line and str(store / "ckpt" / "model.npz") in line and "no space left" in line
    assert (store / "ckpt" / "model.npz").read_bytes() == b"good checkpoint"   # the last good one is kept
    assert _leftovers(store / "ckpt") == []                                     # and nothing half-written


def test_a_writer_killed_before_its_rename_leaves_the_old_file_and_the_next_write_cleans_up(tmp_path):
    target = tmp_path / "forest_checkpoint.npz"
    write_atomic(target, b"round 3")
    ready = tmp_path / "writing"
    # the child stops inside write_atomic, its data written to the partial file and not yet renamed
    # (it blocks in fsync until killed): the state a SIGKILL or power loss mid-write leaves
    child = textwrap.dedent(f"""
        import os, pathlib, sys
        from orchard import storage
        def stuck(fd):
            pathlib.Path({str(ready)!r}).write_text("now")
            sys.stdin.read()
        storage.atomic.os.fsync = stuck
        storage.write_atomic(pathlib.Path({str(target)!r}), b"round 4" * 100_000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, env=_CHILD_ENV)
    try:
        while not ready.exists():
            assert proc.poll() is None, "the writer ended before it was killed"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert target.read_bytes() == b"round 3"                 # what resume reads: the whole old version
    assert len(_leftovers(tmp_path)) == 1                    # the dead writer's partial, under its own name
    write_atomic(target, b"round 4")
    assert target.read_bytes() == b"round 4" and _leftovers(tmp_path) == []


def test_partials_of_a_live_writer_are_never_cleaned(tmp_path):
    mine = tmp_path / partial_name("model.pt")                # this process: alive
    mine.write_bytes(b"half")
    assert clean_partials(tmp_path) == 0 and mine.exists()


def test_a_folder_is_replaced_whole_or_not_at_all(tmp_path):
    """A model folder and a predict run's predictions/ (``atomic_folder``): a write that fails half
    way (here a full disk, as the kernel says it) leaves the previous folder and no partial one; a
    write that succeeds replaces it whole."""
    import errno

    import pytest

    from orchard.storage import atomic_folder

    model = tmp_path / "model"
    model.mkdir()
    (model / "MLmodel").write_text("old")
    with pytest.raises(StorageFull, match="No space left on device"):
        with atomic_folder(model) as partial:
            partial.mkdir()
            (partial / "MLmodel").write_text("new, half written")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert (model / "MLmodel").read_text() == "old" and _leftovers(tmp_path) == []
    with atomic_folder(model) as partial:
        partial.mkdir()
        (partial / "MLmodel").write_text("new")
    assert sorted(p.name for p in model.iterdir()) == ["MLmodel"] and (model / "MLmodel").read_text() == "new"
    assert _leftovers(tmp_path) == []

    # a predict run's folder: tests/orchard/config/test_registry.py (the core opens it around predict.py)


def test_a_folder_named_by_its_content_keeps_the_copy_published_first(tmp_path, monkeypatch):
    """The datasets rendered once per setting (forest's avatars, flower's field:
    ``atomic_folder(keep_existing=True)``): a run that finishes rendering after another one
    published the same folder, before it looked or between its look and its rename, drops its
    own copy and leaves the first one whole, with no partial folder behind."""
    from orchard.storage import atomic, atomic_folder

    data = tmp_path / "avatars-0123456789"

    def render(folder, text):
        folder.mkdir()
        (folder / "000000_depth.png").write_text(text)

    with atomic_folder(data, keep_existing=True) as partial:
        render(partial, "first")
    with atomic_folder(data, keep_existing=True) as partial:   # published before this one looked
        render(partial, "second")
    assert (data / "000000_depth.png").read_text() == "first" and _leftovers(tmp_path) == []

    other = tmp_path / "field-0123456789"
    real_rename = os.rename

    def published_meanwhile(src, dst):   # another run's rename lands just before this one's
        if Path(dst) == other and not other.exists():
            render(other, "theirs")
        return real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", published_meanwhile)
    with atomic_folder(other, keep_existing=True) as partial:
        render(partial, "mine")
    assert (other / "000000_depth.png").read_text() == "theirs" and _leftovers(tmp_path) == []
