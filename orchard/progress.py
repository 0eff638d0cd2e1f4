"""Live progress on the driver and the end-of-run summary table.

Workers call ``ctx.progress(step, total, desc, **rates)``; a thread on the driver polls the
run's sink and redraws one line: description, step/total, rates, elapsed and ETA.  When stdout
is not a terminal (CI, logs) it stays quiet unless ``progress=always``.
"""
from __future__ import annotations

import shutil
import sys
import threading
import time


def _fmt_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def render(report: dict, started: float, now: float, label: str) -> str:
    """One progress line from a ``ctx.progress`` report."""
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
    if total and step:
        parts.append(f"ETA {_fmt_time(elapsed * (total - step) / step)}")
    return "  ".join(parts)


class ProgressLine:
    """Background thread that redraws the progress line from the sink every ``period_s``."""

    def __init__(self, sink, label: str, mode: str = "auto", period_s: float = 0.5, stream=None):
        self.stream = stream or sys.stdout
        self.enabled = mode == "always" or (mode == "auto" and self.stream.isatty())
        self.sink, self.label, self.period = sink, label, period_s
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._last_ts = None
        self._drawn = False

    def __enter__(self):
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.enabled:
            self._thread.join(timeout=2)
            if self._drawn:
                self.stream.write("\n")
                self.stream.flush()

    def _loop(self) -> None:
        import ray

        tty = self.stream.isatty()
        while not self._stop.wait(self.period):
            try:
                report = ray.get(self.sink.get_progress.remote(), timeout=5)
            except Exception:
                continue
            if not report or report.get("ts") == self._last_ts:
                continue
            self._last_ts = report.get("ts")
            line = render(report, self.started, time.time(), self.label)
            if tty:
                width = shutil.get_terminal_size((120, 20)).columns
                self.stream.write("\r" + line[: width - 1].ljust(width - 1))
            else:  # progress=always into a log: one line per update, at most every period
                self.stream.write(line + "\n")
            self.stream.flush()
            self._drawn = True


_SPLIT_ORDER = {name: i for i, name in enumerate(
    ["test", "val", "eval", "infer", "throughput", "time", "train", "comm", "gpu", "system"])}


def summary_table(title: str, metrics: dict[str, float], footer: list[str], limit: int = 30) -> str:
    """A plain-text table of the run's key metrics for the end of the CLI output."""
    # Per-node resource series clutter the table; their run-level summaries stay.  Results a
    # user looks for first (held-out, validation) lead; peers and bookkeeping follow.
    keys = [k for k in metrics if not (k.count("/") > 1 and k.startswith("system/"))]
    keys.sort(key=lambda k: (_SPLIT_ORDER.get(k.split("/")[0], len(_SPLIT_ORDER)), k))
    rows = [(k, metrics[k]) for k in keys][:limit]
    width = max([len(k) for k, _ in rows] + [len(title), 10])
    lines = [title, "-" * (width + 16)]
    for key, value in rows:
        lines.append(f"{key:<{width}}  {value:>14,.6g}")
    if len(keys) > limit:
        lines.append(f"... and {len(keys) - limit} more in MLflow")
    lines.append("-" * (width + 16))
    lines.extend(footer)
    return "\n".join(lines)
