"""orchard/terminal/console.py: the process log (descriptors 1 and 2, where Ray's and torch's lines go)
rotates by size, a run's part of it is still whole from the kept files, and release gives the
terminal back. In a child process: ``quiet`` takes over the descriptors."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def test_the_log_rotates_by_size_and_a_runs_part_spans_the_kept_files(tmp_path):
    child = textwrap.dedent(f"""
        import os, pathlib
        from orchard.terminal import console
        path = console.quiet(pathlib.Path({str(tmp_path)!r}), max_bytes=10_000, backups=2)
        console.mark_run_start()                   # a first run (its part starts at the process start)
        for i in range(40):                        # 40 x 1 kB written straight to fd 1, as Ray's C++ does
            if i == 25:
                start = console.mark_run_start()   # the second run opens mid-file
            os.write(1, (f"line {{i:04d}} " + "x" * 989 + "\\n").encode())
            console.rotate_if_full()
        console.say("orchard: done")
        console.copy_run_part(start, pathlib.Path({str(tmp_path / "run" / "orchard.log")!r}))
        console.copy_run_part(0, pathlib.Path({str(tmp_path / "first.log")!r}))
        print("log at", path, file=console.terminal())
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert done.returncode == 0, done.stderr
    logs = sorted(p for p in tmp_path.iterdir() if p.name.startswith("orchard-"))
    assert len(logs) == 3                                               # the live file and 2 rotated
    assert all(p.stat().st_size <= 11_000 for p in logs)                # each near max_bytes
    total = b"".join(p.read_bytes() for p in logs)
    assert b"line 0039" in total and b"line 0000" not in total          # the oldest went
    part = (tmp_path / "run" / "orchard.log").read_text()
    assert part.startswith("line 0025") and "line 0039" in part and part.rstrip().endswith("orchard: done")
    assert "line 0024" not in part
    first = (tmp_path / "first.log").read_text()   # a part that began in a file already removed says so
    assert first.startswith("[orchard: 20000 bytes of this run's log were rotated away]\nline 0020")


def test_release_gives_the_descriptors_back_to_the_terminal(tmp_path):
    """A caller running orchard's CLI in its own process (a notebook, a test) gets its terminal
    back: what is written to descriptor 2 after ``release`` reaches it, not the log."""
    child = textwrap.dedent(f"""
        import os, pathlib
        from orchard.terminal import console
        path = console.quiet(pathlib.Path({str(tmp_path)!r}))
        os.write(2, b"into the log\\n")
        console.release()
        os.write(2, b"on the terminal\\n")
        console.say("orchard: also on the terminal", file=__import__("sys").stderr)
        console.quiet(pathlib.Path({str(tmp_path / "again")!r}))   # and quiet again, to a new log
        os.write(2, b"into the second log\\n")
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["on the terminal", "orchard: also on the terminal"]
    (log,) = [p for p in tmp_path.iterdir() if p.name.startswith("orchard-")]
    assert log.read_text() == "into the log\n"
    assert [p.read_text() for p in (tmp_path / "again").iterdir()] == ["into the second log\n"]


def test_another_process_log_is_copied_from_the_runs_offset_or_whole_once_rotated(tmp_path):
    """A sweep's driver keeps the part of a killed trial's log that belongs to its run
    (``copy_other_log``, sweep/trials.py): from the offset the trial recorded; the whole file,
    marked, where the log was rotated since (the file is now shorter than the offset)."""
    from orchard.terminal import console

    log = tmp_path / "orchard-trial.log"
    log.write_text("an earlier run's lines\nthis run's first line\nits last line\n")
    start = len("an earlier run's lines\n")
    dest = console.copy_other_log(log, start, tmp_path / "run" / "orchard.log")
    assert dest.read_text() == "this run's first line\nits last line\n"
    log.write_text("after a rotation\n")
    assert console.copy_other_log(log, start, dest).read_text() == (
        "[orchard: the start of this run's log was rotated away]\nafter a rotation\n")
