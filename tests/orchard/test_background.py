"""orchard/background.py: workload threads that the run lifecycle waits for before Ray stops."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from orchard import background
from orchard.terminal import interrupts


def test_join_all_waits_for_a_thread_that_is_winding_down():
    stopping = threading.Event()
    done = []

    def work():
        stopping.wait(5)
        time.sleep(0.3)  # cleaning up after the stop: Ray must not stop under it
        done.append(True)

    background.start(work, name="winding-down")
    stopping.set()
    assert background.join_all(timeout=5) == []
    assert done == [True]


def test_join_all_gives_up_after_its_timeout_and_names_the_thread():
    release = threading.Event()
    background.start(release.wait, 30, name="stuck-in-ray")
    try:
        assert background.running() == ["stuck-in-ray"]   # what the lifecycle checks before it aborts Train runs
        assert background.join_all(timeout=0.3) == ["stuck-in-ray"]
    finally:
        release.set()
    assert background.join_all(timeout=5) == []
    assert background.running() == []


def test_call_returns_the_result_and_raises_the_error_of_fn():
    assert background.call(lambda a, b: a + b, 2, 3, name="adder") == 5
    with pytest.raises(ValueError, match="bad data"):
        background.call(lambda: (_ for _ in ()).throw(ValueError("bad data")), name="failing")


def test_an_interrupt_while_waiting_sets_stopping_and_the_thread_is_joined_later():
    stopping = threading.Event()
    seen = []

    def rounds():
        while not stopping.wait(0.05):
            pass
        seen.append("stopped")

    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with interrupts.raising(), pytest.raises(interrupts.Interrupted) as caught:
        background.call(rounds, name="rounds", stopping=stopping)
    assert caught.value.exit_code == 143
    assert stopping.is_set()
    assert background.join_all(timeout=5) == [] and seen == ["stopped"]


def test_a_poller_ticks_until_stopped_skips_a_failing_tick_and_ends_on_done():
    import time

    from orchard.background import Poller

    ticks = []

    def tick():
        ticks.append(time.monotonic())
        if len(ticks) == 2:
            raise OSError("the store is away")   # skipped: the next tick comes
        if len(ticks) == 4:
            return Poller.DONE

    poller = Poller(tick, 0.01, "orchard-test-poller", at_once=True).start()
    deadline = time.monotonic() + 5
    while poller.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ticks) == 4 and not poller.alive()

    slow = []
    with Poller(lambda: slow.append(1), 60.0, "orchard-test-slow") as waiting:
        assert waiting.alive() and slow == []          # no tick before the first period without at_once
    assert not waiting.alive() and waiting.stopping.is_set()   # stop() wakes the wait at once


def test_a_poller_whose_tick_outlasts_its_stop_is_waited_for_before_ray_stops():
    # the driver's sampler was still in its tick (logging to the sink, in Ray) when its owner
    # stopped it on a loaded machine: Ray stopping under it would end the process with status 1
    release, ended = threading.Event(), []

    def tick():
        release.wait(5)
        ended.append(True)

    poller = background.Poller(tick, 0.01, "orchard-test-sampler", at_once=True).start()
    time.sleep(0.05)                       # inside its first tick
    poller.stop(timeout_s=0.05)            # gives up waiting: the tick goes on
    assert poller.alive() and background.running() == ["orchard-test-sampler"]
    threading.Timer(0.3, release.set).start()
    assert background.join_all(timeout=5) == [] and ended == [True]
    assert background.running() == []


def test_warm_imports_imports_at_the_lowest_priority_off_the_main_thread_and_skips_what_fails(tmp_path, monkeypatch):
    import sys

    (tmp_path / "orchard_warm_probe.py").write_text(
        "import os, threading\n"
        "NICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "THREAD = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    thread = background.warm_imports("orchard_no_such_module", "orchard_warm_probe")
    thread.join(30)
    probe = sys.modules.pop("orchard_warm_probe")
    assert not thread.is_alive() and probe.THREAD == "orchard-warm-imports"
    assert probe.NICE == 19                                  # that thread's priority alone
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19   # not the caller's


def _side_probe() -> dict:
    import sys

    return {"pid": os.getpid(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "ignores_ctrl_c": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
            "imported": "orchard_side_probe" in sys.modules}


def test_a_side_process_runs_jobs_in_its_own_process_at_the_lowest_priority_its_imports_made(tmp_path, monkeypatch):
    (tmp_path / "orchard_side_probe.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))  # the process starts with this process's sys.path
    side = background.SideProcess(("orchard_no_such_module", "orchard_side_probe"))  # a failed import is skipped
    try:
        probe = side.submit(_side_probe).result(120)
        with pytest.raises(ZeroDivisionError):  # a job's error is its Future's
            side.submit(divmod, 1, 0).result(60)
    finally:
        side.stop()
    assert probe["pid"] != os.getpid() and probe["nice"] == 19 and probe["imported"]
    assert probe["ignores_ctrl_c"]  # Ctrl-C reaches the whole process group; the driver answers it
    assert os.getpriority(os.PRIO_PROCESS, 0) < 19  # not the caller's


def test_stopping_a_side_process_ends_it_with_a_job_still_running():
    """A failed or interrupted run waits for no job of its side process (a t-SNE of many points)."""
    import psutil

    side = background.SideProcess(())
    pid = side.submit(os.getpid).result(120)
    job = side.submit(time.sleep, 600)
    while not job.running():
        time.sleep(0.05)
    side.stop()
    assert job.done()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    side.stop()  # again: nothing left to stop


def test_bounded_gives_the_result_the_error_or_a_timeout_and_leaves_no_thread_to_wait_for():
    """A preflight probe off the main thread: its answer, its error as raised, or TimeoutError
    once its wait is over, the probe left running as a daemon the run does not wait for."""
    assert background.bounded(lambda a, b: a + b, 2, 3, timeout_s=5, name="adds") == 5
    with pytest.raises(ValueError, match="refused"):
        background.bounded(lambda: (_ for _ in ()).throw(ValueError("refused")), timeout_s=5, name="refuses")
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer within 0.3 s"):
        background.bounded(release.wait, 30, timeout_s=0.3, name="stuck-probe")
    assert time.monotonic() - started < 2
    (stuck,) = [t for t in threading.enumerate() if t.name == "stuck-probe"]
    assert stuck.daemon and "stuck-probe" not in background.running()
    release.set()
