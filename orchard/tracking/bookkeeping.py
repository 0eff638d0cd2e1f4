"""A run's bookkeeping: counters that say how a run went about its work (cache hits and misses,
workers, nodes lost, restarts) rather than what it learned.

The MLflow UI draws every metric as a chart and opens a run's charts on the alphabetically first
section (MLflow 3.17: a section is the name before its last ``/``, sections sorted by code point,
``system/`` and unprefixed names last), so one-point ``cache/``, ``cluster/`` and ``data/``
counters opened a run before ``headline/``, ``train/``, ``val/`` and ``test/``. These names are
no metrics: the run's metrics sink keeps their last values in one artifact,
``tables/bookkeeping.json`` (name -> value), and in what it hands the end-of-run summary, so a
workload logs them with ``ctx.log_metrics`` as before and reads them back with ``read``.

Node-loss figures and skipped inputs (``data/skipped_*``) are events: in a run where nothing
happened they are zeros (bookkeeping);
from the moment something does (a node lost or joined, a restart, a worker group of another
size than it started with) they are charts as well, their quiet points written first, so a user sees the loss while
the run recovers and when each node went and came.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

ARTIFACT = "tables/bookkeeping.json"
PREFIXES = ("cache/", "data/")   # data/: the sizes of the data a run read (videos, images, samples)
NAMES = frozenset({"train/workers"})
# a Train worker's GPU as it started (gpu_peak.py: system/w<rank>_gpu_other_mb, ..._total_mb)
SYSTEM_SUFFIXES = ("_gpu_other_mb", "_gpu_total_mb")


def _zero(metric) -> bool:
    return metric.value == 0


def _first_start(metric) -> bool:
    return metric.step <= 1  # logged at each start of a worker group, the step counting its starts


# event series -> whether a point is quiet (nothing happened): a series is a chart from its first other point
EVENTS = {"cluster/nodes_lost": _zero, "cluster/nodes_joined": _zero, "train/restarts": _zero, "train/lost_s": _zero,
          "train/group_workers": _first_start}
EVENT_PREFIXES = {"data/skipped": _zero}   # data/skipped_files, .../<kind>, forest's data/skipped_pairs
MAX_HELD = 100  # quiet points held per event series until it becomes a chart


def _quiet_test(key: str):
    """The quiet-point test of an event series (None: ``key`` is no event)."""
    if key in EVENTS:
        return EVENTS[key]
    return next((quiet for prefix, quiet in EVENT_PREFIXES.items() if key.startswith(prefix)), None)


def is_event(key: str) -> bool:
    """``key`` is an event series: bookkeeping while quiet, a chart from its first other point."""
    return _quiet_test(key) is not None


def is_bookkeeping(key: str) -> bool:
    """``key`` is bookkeeping: kept in ``tables/bookkeeping.json``, not (or not only) a metric."""
    return (key.startswith(PREFIXES) or key in NAMES or is_event(key)
            or (key.startswith("system/") and key.endswith(SYSTEM_SUFFIXES)))


class Ledger:
    """The sink's record of a run's bookkeeping: ``route`` takes each logged metric and returns
    what goes to MLflow as metrics; ``values`` is what the artifact holds, ``dirty`` whether it
    changed since it was last written."""

    def __init__(self, values: dict[str, float] | None = None, charted=()):
        self.values: dict[str, float] = dict(values or {})
        self.charted: set[str] = set(charted)  # event series that became charts
        self.dirty = False
        self._held: dict[str, list] = {}

    def route(self, metric) -> list:
        """``[metric]`` for a metric, ``[]`` for bookkeeping, and for an event series' first point
        that is not quiet the points held back before it, then this one."""
        key = metric.key
        if not is_bookkeeping(key):
            return [metric]
        if key not in self.values or self.values[key] != metric.value:
            self.values[key] = metric.value
            self.dirty = True
        if key in self.charted:
            return [metric]
        quiet = _quiet_test(key)
        if quiet is None:
            return []
        held = self._held.setdefault(key, [])
        if quiet(metric):
            if len(held) < MAX_HELD:
                held.append(metric)
            return []
        self.charted.add(key)
        return self._held.pop(key) + [metric]

    def snapshot(self) -> dict[str, float]:
        self.dirty = False
        return dict(sorted(self.values.items()))


def read(client, run_id: str) -> dict[str, float]:
    """A run's bookkeeping as its ``tables/bookkeeping.json`` holds it (empty: none recorded)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, ARTIFACT, tmp)
        except Exception:  # noqa: BLE001 - no such artifact (a run of an older orchard, none logged)
            return {}
        return json.loads(Path(path).read_text())


def opening_section(sections: list[str]) -> str | None:
    """The section a run's charts open on once the events that happened are passed: events
    (``EVENT_PREFIXES``, as ``data/skipped_files``) are charts only when they happened, and lead as
    a warning would; then comes what a user compares, the headline for every workload."""
    def is_event_section(section: str) -> bool:
        return any(section.startswith(prefix) or prefix.startswith(section + "/") for prefix in EVENT_PREFIXES)

    return next((s for s in sections if not is_event_section(s)), None)


def chart_sections(keys) -> list[str]:
    """The chart sections MLflow 3.17's run page shows for these metric names, in its order: a
    section per name before the last ``/``, sorted by code point; ``system/`` ("System metrics")
    and names without a prefix ("Model metrics") last. What the tests hold orchard's names to:
    the headline first, no bookkeeping before it."""
    sections = {k.rsplit("/", 1)[0] for k in keys if "/" in k and not k.startswith("system/")}
    tail = ["Model metrics"] * any("/" not in k for k in keys) + ["System metrics"] * any(
        k.startswith("system/") for k in keys)
    return sorted(sections) + tail
