"""Live progress on the driver.

Workers call ``ctx.progress(step, total, desc, **rates)``; a thread on the driver polls the
run's sink and redraws one line: description, step/total, rates, elapsed and ETA.  When stdout
is not a terminal (CI, a log, a pipe) it prints a plain line every ``PLAIN_PERIOD_S`` instead
(``progress=always``: at every update; ``never``: not at all).
"""
from __future__ import annotations

import shutil
import time

from orchard import background
from orchard.terminal import console


PLAIN_PERIOD_S = 15.0  # progress lines into a file or pipe (progress=auto): one per this many seconds


def _fmt_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def render(report: dict, started: float, now: float, label: str, first: tuple | None = None) -> str:
    """One progress line from a ``ctx.progress`` report; ``first`` = (step, time) of the first
    report seen, so the ETA counts the work's own rate, not the start-up before it: at that first
    report there is no rate yet, and no ETA (one from the elapsed time, start-up included, said
    3m41s for a smoke forest whose training ended 4 s later)."""
    step, total = report.get("step", 0), report.get("total")
    parts = [f"[{label}]"]
    if report.get("desc"):
        parts.append(str(report["desc"]))
    if total:
        frac = min(1.0, step / total) if total else 0.0
        bar = "#" * int(frac * 20)
        parts.append(f"|{bar:<20}| {step}/{total}")
    else:
        parts.append(f"step {step}")
    for key, value in (report.get("rates") or {}).items():
        parts.append(f"{key} {value:,.4g}")
    elapsed = now - started
    parts.append(f"elapsed {_fmt_time(elapsed)}")
    if total and first is not None and step > first[0] and now > first[1]:
        parts.append(f"ETA {_fmt_time((now - first[1]) / (step - first[0]) * (total - step))}")
    elif total and step and first is None:
        parts.append(f"ETA {_fmt_time(elapsed * (total - step) / step)}")
    return "  ".join(parts)


class ProgressLine:
    """Background thread that redraws the progress line from the sink every ``period_s``."""

    def __init__(self, sink, label: str, mode: str = "auto", period_s: float = 0.5, stream=None):
        self.stream = stream or console.terminal(err=True)  # the terminal even while Ray's lines go to the log
        self.enabled = mode in ("always", "auto")
        self.every = 0.0 if mode == "always" or self.stream.isatty() else PLAIN_PERIOD_S
        self._printed_at = 0.0
        self._first: tuple | None = None
        self.sink, self.label, self.period = sink, label, period_s
        self.started = time.time()
        self._poller = background.Poller(self._redraw, period_s, "orchard-progress")   # a busy sink: next time
        self._last_ts = None
        self._drawn = False

    def __enter__(self):
        if self.enabled:
            self._poller.start()
        return self

    def __exit__(self, *exc):
        self._poller.stop(timeout_s=2)
        if self.enabled:
            if self._drawn and self.stream.isatty():  # end the redrawn line
                self.stream.write("\n")
                self.stream.flush()

    def _redraw(self) -> None:
        import ray

        report = ray.get(self.sink.get_progress.remote(), timeout=5)
        if not report or report.get("ts") == self._last_ts:
            return
        self._last_ts = report.get("ts")
        if self._first is None or report.get("step", 0) < self._first[0]:  # a new phase restarts the count
            self._first = (report.get("step", 0), report.get("ts") or time.time())
        line = render(report, self.started, time.time(), self.label, self._first)
        if self.stream.isatty():
            width = shutil.get_terminal_size((120, 20)).columns
            self.stream.write("\r" + line[: width - 1].ljust(width - 1))
        else:  # not a terminal: a plain line, at most every `every` seconds
            if time.time() - self._printed_at < self.every:
                return
            self._printed_at = time.time()
            self.stream.write(line + "\n")
        self.stream.flush()
        self._drawn = True
