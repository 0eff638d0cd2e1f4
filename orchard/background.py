"""Threads: workload work off the main thread, which the run lifecycle waits for before it stops
Ray (``start``, ``call``, ``join_all``), ``Poller``, the one shape of every periodic thread,
``warm_imports``, what a run's ending imports, imported while its workers train, and
``side_process``, a process for the CPU work of a driver that is busy itself while they train.

Why off the main thread: the main thread keeps orchard's SIGINT/SIGTERM handler
(orchard/terminal/interrupts.py). Ray defers SIGINT while the main thread submits a task, so a SIGTERM
landing in that window reached orchard as a SIGINT; and Ray Train's ``fit()`` on the main thread
installs a SIGINT handler of its own that answers Ctrl-C with ``SystemExit(0)``. Loops that submit
many tasks, and Train runs, therefore run here while the main thread waits, interruptibly.

Why the lifecycle waits for them: a thread still inside Ray when Ray shuts down makes Ray's core
worker end the whole process with status 1, so an interrupted run would exit 1 instead of 130/143.
``join_all`` (called by ``lifecycle.ray_session`` before it stops Ray) gives every thread started
here ``STOP_TIMEOUT_S`` to return; a workload only has to make its threads notice the stop (an
event, or queues shut down). Daemon threads, not a ThreadPoolExecutor: the interpreter joins those
at exit, and one stuck in a stopped Ray would keep the process from ever exiting.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures

STOP_TIMEOUT_S = 60.0  # at most this long, all threads together, before Ray is stopped anyway

_threads: set[threading.Thread] = set()
_lock = threading.Lock()


def start(fn, *args, name: str) -> Future:
    """``fn(*args)`` in a daemon thread the lifecycle waits for; its result or error as a Future."""
    future: Future = Future()

    def target() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(exc)
        finally:
            with _lock:
                _threads.discard(threading.current_thread())

    thread = threading.Thread(target=target, name=name, daemon=True)
    with _lock:
        _threads.add(thread)
    thread.start()
    return future


def call(fn, *args, name: str, stopping: threading.Event | None = None):
    """``fn(*args)`` off the main thread while the caller waits interruptibly; returns its result.

    An interrupt (or any error) in the waiting thread sets ``stopping`` so that ``fn`` can wind
    down, and is raised at once; ``join_all`` waits for ``fn`` to return before Ray stops.
    From a thread other than the main one (Tune trials), ``fn`` simply runs there."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    future = start(fn, *args, name=name)
    wait([future], stopping)
    return future.result()


def wait(futures, stopping: threading.Event | None = None) -> None:
    """Wait for every one of ``futures``, interruptibly: in short slices, between which the main
    thread's signal handlers run. An interrupt sets ``stopping`` (if given) and is raised."""
    try:
        while wait_futures(futures, timeout=0.2).not_done:
            pass
    except BaseException:
        if stopping is not None:
            stopping.set()
        raise


def bounded(fn, *args, timeout_s: float, name: str):
    """``fn(*args)`` on a daemon thread, waited for interruptibly at most ``timeout_s`` s: its
    result, its error, or ``TimeoutError``. For a preflight probe that a C++ client may hold for
    many minutes (pyarrow's GCS client, 16 min and still retrying here; a database driver without
    a connect timeout, for ever), inside which the main thread is deaf to Ctrl-C and SIGTERM. A probe still
    stuck is left behind: not one of the run's threads (``join_all`` does not wait for it), and a
    daemon, so it never holds up the exit."""
    future: Future = Future()

    def target() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            future.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not future.done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {timeout_s:g} s")
        wait_futures([future], timeout=min(0.2, left))
    return future.result()


def running() -> list[str]:
    """The names of the threads started here that are still running."""
    with _lock:
        return [t.name for t in _threads if t.is_alive()]


def join_all(timeout: float = STOP_TIMEOUT_S) -> list[str]:
    """Wait, at most ``timeout`` s in all, for the threads started here; the names of those still
    running. A second Ctrl-C cuts the wait short (the first one already decided the outcome)."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            with _lock:
                alive = [t for t in _threads if t.is_alive()]
            if not alive or time.monotonic() >= deadline:
                return [t.name for t in alive]
            alive[0].join(min(0.2, max(0.0, deadline - time.monotonic())))
    except KeyboardInterrupt:
        with _lock:
            return [t.name for t in _threads if t.is_alive()]


class Poller:
    """``tick()`` every ``every_s`` seconds on a daemon thread until ``stop()``: the one shape of
    every periodic thread in orchard (the heartbeat, the lease's beat, the node watch, the
    samplers, the progress line, the sweep's metric feed, the log's rotation).

    ``at_once``: the first tick right away, then one every ``every_s``.
    A tick may change ``every_s`` for the waits after it (a backoff while a store is away).
    A tick that raises is skipped and the next one comes (a busy GCS or store: look again next
    time); one that returns ``Poller.DONE`` ends the poller. ``stopping`` is set by ``stop()``, so
    a tick that waits can wait on it. Not one of the threads ``join_all`` waits for: its owner stops
    it (usually as a context manager), before or after Ray, as the owner's own docstring says; but
    one still in its tick when ``stop()`` gives up waiting becomes one of them, since that tick may
    be inside Ray (a sampler's tick logging to the sink on a loaded machine when Ctrl-C came)."""

    DONE = object()

    def __init__(self, tick, every_s: float, name: str, at_once: bool = False):
        self.tick, self.every_s, self.name, self.at_once = tick, every_s, name, at_once
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Poller":
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the thread to end and wait for it, at most ``timeout_s`` (default: two periods)."""
        self.stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2 * self.every_s + 1.0 if timeout_s is None else timeout_s)
            if self._thread.is_alive():  # its tick is still in a call: waited for before Ray stops
                with _lock:
                    _threads.add(self._thread)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Poller":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        if self.at_once and self._once() is Poller.DONE:
            return
        while not self.stopping.wait(self.every_s):
            if self._once() is Poller.DONE:
                return

    def _once(self):
        try:
            return self.tick()
        except Exception:  # noqa: BLE001 - see the class docstring: the next tick looks again
            return None


def warm_imports(*modules: str) -> threading.Thread:
    """Import ``modules`` in a daemon thread at the lowest CPU priority, now.

    A workload calls it as it hands its work to its workers, naming what its ending imports (the
    model's exporter, the figures' libraries): the driver's ending runs alone, one core busy and
    the others idle, while during training the driver waits; imported then, at the lowest
    priority, those imports take CPU the workers leave over rather than the ending's. The
    thread touches no Ray (the lifecycle need not wait for it); a module that fails to import is
    left to the code that needs it, which raises the error where it means something."""
    def warm() -> None:
        if sys.platform.startswith("linux"):  # there a thread has a priority of its own
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except OSError:
                pass
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - see the docstring
                pass

    thread = threading.Thread(target=warm, name="orchard-warm-imports", daemon=True)
    thread.start()
    return thread


class SideProcess:
    """A process beside the driver for the CPU work of a run's ending (t-SNE, figures), started
    at the lowest CPU priority with ``modules`` imported there first; ``submit(fn, *args)`` (``fn``
    a module-level function, its arguments and result picklable) returns a Future.

    For a driver that is busy itself while its workers train (singa drives every round):
    ``warm_imports``' thread would hold its Python lock while it waits for a core, and stall it; a
    process has a lock of its own. The lifecycle starts it as Ray starts (a workload names its
    imports as ``SIDE_IMPORTS``; the run's context holds it as ``ctx.side``), so its imports take
    CPU that Ray's start and the workers leave over, and its jobs run while the driver logs the
    model. It is a process of the driver's node (jobs reach it through a pipe, no path is
    shared); it ignores Ctrl-C, which is the driver's to answer, and the run stops it as it ends."""

    def __init__(self, modules: tuple[str, ...]):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: the driver holds Ray's and gRPC's threads, which a forked child inherits half-done
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_side_process_start, initargs=(tuple(modules),))
        self._pool.submit(int)  # a pool starts its process at the first submit: now

    def submit(self, fn, *args) -> Future:
        return self._pool.submit(fn, *args)

    def stop(self) -> None:
        """The process ended now, a job still running with it (the workload has waited for the
        jobs it needs; a failed or interrupted run waits for none). Idempotent."""
        # Python 3.14 names this terminate_workers()
        for process in list((getattr(self._pool, "_processes", None) or {}).values()):
            process.terminate()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _side_process_start(modules: tuple[str, ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the driver answers it
    os.environ.setdefault("MPLBACKEND", "Agg")  # what it draws becomes bytes, never a window
    try:
        os.nice(19)
    except (AttributeError, OSError):  # no nice (Windows), or not allowed: the default priority
        pass
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - left to the job that needs it, which raises where it means something
            pass
