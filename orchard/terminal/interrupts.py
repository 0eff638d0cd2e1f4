"""Ctrl-C and SIGTERM as one exception, so every run ends with its true status and exit code.

``raising()`` turns SIGINT and SIGTERM into ``Interrupted`` in the main thread while a run is
under way; ``deferred()`` holds them back while the run is being closed (MLflow status, sink,
Ray), so a second Ctrl-C cannot leave a run RUNNING.  Exit codes follow the shell's
convention, 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM.

Libraries that install their own SIGINT handler are kept out of the way or joined in:
Ray Train's is never installed because orchard calls ``trainer.fit()`` from a worker thread
(``orchard/strategies/launch.py``); Ray Tune's stops the sweep gracefully and SIGTERM is passed
on to it (``_on_signal``), so a sweep interrupted either way saves its state for resuming.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
received: list[int] = []  # signals seen in this process, oldest first (read by sweeps)


class Interrupted(KeyboardInterrupt):
    """The run was stopped from outside: Ctrl-C (SIGINT) or SIGTERM."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def as_interrupted(exc: KeyboardInterrupt, since: int = 0) -> Interrupted:
    """``exc`` as an ``Interrupted`` naming its true signal.

    A plain KeyboardInterrupt was raised by a library, not by orchard's handler: Python's own
    Ctrl-C handler, or Ray's deferral of SIGINT while it submits a task, which raises one when it
    ends, also for the SIGTERM orchard handed it (``_on_signal``).  It stands for the first signal
    this process received since ``since`` (an index into ``received``), SIGINT if none."""
    if isinstance(exc, Interrupted):
        return exc
    return Interrupted(received[since] if len(received) > since else signal.SIGINT)


def exit_code(exc: KeyboardInterrupt, since: int = 0) -> int:
    """128 + the signal that stopped the run: 130 for Ctrl-C, 143 for SIGTERM."""
    return as_interrupted(exc, since).exit_code


# A handler's exception raised while the main thread runs a weakref callback or ``__del__``
# (the garbage collector runs them at any bytecode; sqlalchemy's registries do) is printed as
# "Exception ignored in ..." and dropped: the Ctrl-C would be lost and the run go on.  Python
# hands such exceptions to ``sys.unraisablehook``; orchard's delivers the signal again, so it is
# raised once more where it can propagate.
def _unraisable(unraisable) -> None:
    import os

    if isinstance(unraisable.exc_value, Interrupted):
        # from another thread, a moment later: raised here, it would be dropped again
        timer = threading.Timer(0.05, os.kill, (os.getpid(), unraisable.exc_value.signum))
        timer.daemon = True
        timer.start()
        return
    _previous_unraisable(unraisable)


def _install_unraisable_hook() -> None:
    global _previous_unraisable
    import sys

    if sys.unraisablehook is not _unraisable:
        _previous_unraisable = sys.unraisablehook
        sys.unraisablehook = _unraisable


_previous_unraisable = None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


_forwarded_term = False  # a SIGTERM was handed to a library's SIGINT handler (see _on_signal)


def _on_signal(signum, frame) -> None:
    global _forwarded_term
    if signum == signal.SIGINT and _forwarded_term:
        # the library handed our SIGTERM back as a SIGINT (Ray defers SIGINT while it submits
        # a task, then calls this handler): it is still the SIGTERM
        _forwarded_term, signum = False, signal.SIGTERM
    else:
        received.append(int(signum))
        current_sigint = signal.getsignal(signal.SIGINT)
        if (signum == signal.SIGTERM and callable(current_sigint)
                and current_sigint not in (_on_signal, signal.default_int_handler)):
            # A library's SIGINT handler is in place: Ray Tune's graceful stop during a sweep,
            # or Ray's deferral while it submits a task.  Let it do what it does on Ctrl-C.
            _forwarded_term = True
            current_sigint(signal.SIGINT, frame)
            return
    raise Interrupted(signum)


def install() -> None:
    """Put orchard's handlers (back) in place, e.g. after a library replaced them."""
    if _in_main_thread():
        for s in SIGNALS:
            signal.signal(s, _on_signal)


@contextmanager
def _handling(handler):
    """``handler`` for SIGINT and SIGTERM for the duration, in the main thread (elsewhere: no change)."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def raising():
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread."""
    global _forwarded_term
    _forwarded_term = False
    _install_unraisable_hook()
    return _handling(_on_signal)


@contextmanager
def deferred(reraise: bool = False):
    """Hold SIGINT/SIGTERM back for the duration (closing a run must finish).

    With ``reraise`` the first signal held back is raised as ``Interrupted`` on exit."""
    held: list[int] = []

    def hold(signum, frame):
        received.append(int(signum))
        held.append(int(signum))

    with _handling(hold):
        yield
    if held and reraise:
        raise Interrupted(held[0])
