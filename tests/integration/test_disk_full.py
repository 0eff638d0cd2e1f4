"""A disk that fills up mid-run, on a real workload (issue 31): a singa run at ``debug=smoke`` whose
output folder (its run folder, checkpoints and console log) is a small tmpfs, filled by the test once
the first checkpoint is there.  The run must stop with one line naming the file it could not write,
close its MLflow run FAILED with that reason, keep its last whole checkpoint and leave no partial
file behind (orchard/storage/atomic.py, ``write_atomic``).

The MLflow store and its artifacts stay off the tmpfs: a full disk under the run folder is the case
here, not a store that cannot record.  Mounting needs root (CI runs as root); elsewhere it is skipped.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.integration.test_lifecycle import Orchard, runs
from tests.session_ray import attach_overrides

pytestmark = pytest.mark.slow

DISK_MB = 16   # the run's files and two checkpoints (~1.7 MB each for the smoke mlp) fit with room to spare


@pytest.fixture
def small_disk(tmp_path):
    """A ``DISK_MB`` tmpfs mounted at ``tmp_path/disk``, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: cannot make a small disk to fill")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {(done.stderr or done.stdout).strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            # a process of the run (a Ray daemon holding the console log) still has a file open there:
            # detach now, freed when it exits
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


class Filler:
    """Fills a folder's disk until the kernel says ENOSPC, and keeps it full until stopped: space the
    run frees (a failed partial removed, an old checkpoint replaced) is taken again at once, so the
    run cannot get lucky with a checkpoint that just fits into what it freed."""

    def __init__(self, folder: Path):
        self._file = open(folder / "filler", "wb", buffering=0)
        self._stop = threading.Event()
        self.full = threading.Event()
        self._thread = threading.Thread(target=self._keep_full, daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        chunk = b"\0" * (1 << 20)
        while True:
            try:
                if self._file.write(chunk) < len(chunk):  # the last bytes there were: the next write says ENOSPC
                    chunk = chunk[:4096]
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return

    def _keep_full(self) -> None:
        self._fill()
        self.full.set()
        while not self._stop.wait(0.005):
            self._fill()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._file.close()


def test_a_disk_that_fills_mid_run_stops_it_failed_with_one_line_and_keeps_the_last_checkpoint(ray_session, tmp_path,
                                                                                              small_disk):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = Orchard("workload=singa", "singa.arch=local", "debug=smoke", "singa.epochs=1000", "singa.tsne=false",
                  f"tracking.uri={uri}", f"tracking.artifact_location={tmp_path}/artifacts",
                  f"output_dir={small_disk}", *attach_overrides(), cwd=tmp_path)
    filler = None
    try:
        # [1] the first checkpoint written (whole: renamed into place), the run still training
        deadline = time.time() + 600
        while not list(small_disk.glob("singa/*/singa_checkpoint.npz")):
            assert run.proc.poll() is None, f"the run ended before its first checkpoint:\n{run.output()[-3000:]}"
            assert time.time() < deadline, f"no checkpoint within 600 s:\n{run.output()[-3000:]}"
            time.sleep(0.02)
        (checkpoint,) = small_disk.glob("singa/*/singa_checkpoint.npz")
        # [2] the disk full, kept full until the run has ended
        filler = Filler(small_disk)
        assert filler.full.wait(60), "the tmpfs never filled"
        rc = run.wait(timeout_s=600)
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.wait(60)
        if filler is not None:
            filler.stop()
    console = run.output()

    # [3] exit 1, and one line that names the file and says the disk is full
    assert rc == 1, console[-3000:]
    failed = [line for line in console.splitlines() if line.startswith("orchard: singa failed:")]
    assert failed == [f"orchard: singa failed: StorageFull: no space left to write {checkpoint} "
                      f"(No space left on device); its previous version is kept"], console[-3000:]
    assert not [line for line in console.splitlines() if "Traceback" in line and "pid=" not in line], console[-3000:]

    # [4] the MLflow run closed FAILED, with the reason
    (closed,) = runs(uri)
    assert closed.info.status == "FAILED", closed.data.tags.get("orchard.error")
    reason = closed.data.tags["orchard.error"]
    assert "no space left to write" in reason and str(checkpoint) in reason, reason
    assert Path(closed.data.tags["orchard.run_dir"]) == checkpoint.parent

    # [5] the last whole checkpoint is still there, readable without pickle, finite; nothing partial left
    with np.load(checkpoint, allow_pickle=False) as data:
        params = [np.array(data[k]) for k in data.files if k.startswith("p:")]
        assert '"epoch"' in str(data["_meta"])
    assert params and all(np.isfinite(p).all() for p in params)
    partials = [str(p) for p in small_disk.rglob("*") if ".tmp-" in p.name]
    assert partials == [], partials
    # the run's log, copied into its folder as the run closed, is there whole or not at all
    if "the run's log was not kept" in console:
        assert not (checkpoint.parent / "orchard.log").exists(), console[-3000:]
