"""SIGINT and SIGTERM as orchard sees them: one exception, the shell's exit codes, and signals held
back while a run is being opened or closed."""
import os
import signal
import time

import pytest

from orchard.terminal import interrupts


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.2)  # the handler runs in the main thread at the next bytecode


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_raises_interrupted_with_the_shell_exit_code(sig, code):
    with pytest.raises(interrupts.Interrupted) as caught:
        with interrupts.raising():
            _deliver(sig)
    assert caught.value.exit_code == code and interrupts.exit_code(caught.value) == code
    assert signal.Signals(sig).name in str(caught.value)
    assert signal.getsignal(signal.SIGTERM) is not interrupts._on_signal  # handlers restored


def test_signals_during_closing_are_held_back_and_optionally_raised_after():
    with interrupts.raising():
        with interrupts.deferred():
            _deliver(signal.SIGTERM)  # closing a run: nothing may interrupt it
        with pytest.raises(interrupts.Interrupted) as caught:
            with interrupts.deferred(reraise=True):
                _deliver(signal.SIGINT)  # opening a run: finish opening, then stop
        assert caught.value.exit_code == 130


def test_sigterm_is_passed_to_a_librarys_graceful_sigint_handler():
    """Ray Tune stops a sweep gracefully on SIGINT; SIGTERM should do the same, not cut it off."""
    seen = []
    with interrupts.raising():
        previous = signal.signal(signal.SIGINT, lambda s, f: seen.append(s))  # what Tune installs
        try:
            _deliver(signal.SIGTERM)
        finally:
            signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT] and interrupts.received[-1] == signal.SIGTERM


def test_sigterm_while_ray_defers_sigint_during_a_task_submission_is_still_sigterm():
    """Ray holds SIGINT back while it submits a task (DeferSigint), then calls our handler with
    SIGINT: the run must still end as SIGTERM, exit 143."""
    from ray._private.utils import DeferSigint

    with pytest.raises(interrupts.Interrupted) as caught:
        with interrupts.raising():
            with DeferSigint():
                _deliver(signal.SIGTERM)
    assert caught.value.exit_code == 143


def test_a_plain_keyboard_interrupt_counts_as_ctrl_c():
    assert interrupts.exit_code(KeyboardInterrupt(), since=len(interrupts.received)) == 130


def test_a_plain_keyboard_interrupt_raised_by_a_library_after_a_sigterm_is_the_sigterm():
    """A library that catches the signal and raises a KeyboardInterrupt of its own (seen in CI:
    a video run SIGTERMed as a process group ended 130, "interrupted by SIGINT") still ends 143."""
    since = len(interrupts.received)
    with pytest.raises(KeyboardInterrupt) as caught:
        with interrupts.raising():
            previous = signal.signal(signal.SIGINT, _raise_plain)
            try:
                _deliver(signal.SIGTERM)
            finally:
                signal.signal(signal.SIGINT, previous)
    assert type(caught.value) is KeyboardInterrupt  # the library's own, not orchard's
    assert interrupts.exit_code(caught.value, since) == 143
    assert "SIGTERM" in str(interrupts.as_interrupted(caught.value, since))


def _raise_plain(signum, frame):
    raise KeyboardInterrupt


def test_sigterm_under_pythons_own_sigint_handler_raises_sigterm():
    """Some code put Python's default SIGINT handler back: a SIGTERM is not handed to it."""
    with pytest.raises(interrupts.Interrupted) as caught:
        with interrupts.raising():
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                _deliver(signal.SIGTERM)
            finally:
                signal.signal(signal.SIGINT, previous)
    assert caught.value.exit_code == 143


def test_a_signal_that_lands_in_a_garbage_collector_callback_is_not_lost():
    """Raised inside a weakref callback (as sqlalchemy's are, run by the collector at any
    bytecode), the Interrupted would be dropped as "Exception ignored"; it is delivered again."""
    import os
    import signal
    import time
    import weakref

    from orchard.terminal import interrupts

    class Thing:
        pass

    def callback(ref):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs here, inside the callback

    with interrupts.raising():
        try:
            thing = Thing()
            ref = weakref.ref(thing, callback)  # noqa: F841
            del thing
            deadline = time.time() + 5
            while time.time() < deadline:
                time.sleep(0.01)
            raise AssertionError("the SIGTERM was lost")
        except KeyboardInterrupt as exc:
            assert interrupts.exit_code(exc) == 143
