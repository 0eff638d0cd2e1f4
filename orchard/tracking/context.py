"""RunContext: what a workload uses to record its run, from anywhere in the Ray cluster.

A ``RunContext`` is picklable: pass it into Ray tasks, actors and Train workers and call the
same methods there.  Every call becomes one fire-and-forget message to the run's
``MetricsSink`` actor, so a training step never waits on the tracking store.
"""
from __future__ import annotations

import json
import posixpath
import re
import time
from pathlib import Path
from typing import Any, Callable


PROGRESS_INTERVAL_S = 0.25
# "Never sent yet": -inf, not 0.0, which is a moment of time.monotonic() (the machine's boot) that a
# freshly booted machine is still within an interval of
NEVER_SENT = float("-inf")

_VALID_NAMES: set[str] = set()  # metric names this process has checked: MLflow's rules run once per name


class RunContext:
    def __init__(self, sink, run_id: str | None, run_dir: str, workload: str, strategy: str,
                 tracking_uri: str | None = None, storage=None, previous_storage=None):
        self._sink = sink
        self.run_id = run_id
        self.run_dir = Path(run_dir)
        # The run's own folder in the storage location (orchard.storage.Storage): what workers on
        # any node read and write (checkpoints, data, caches). The lifecycle sets it once; no
        # workload rebuilds it from the config.
        self.storage = storage
        # On a resumed run, the storage of the run it continues (Storage.previous_run): where its
        # checkpoints are read from; None for a fresh run.
        self.previous_storage = previous_storage
        self.workload = workload
        self.strategy = strategy
        self.tracking_uri = tracking_uri
        # Set only in the driver process (e.g. a Tune trial reporting its metric); never pickled.
        self._on_metrics: Callable[[dict, int | None], None] | None = None
        self._progress_sent = NEVER_SENT  # per process: progress is throttled, see progress()
        # The run's time split (orchard/tracking/time_split.py), on the driver only: workers never mark it.
        self.time_split = None
        self._drawings: list = []  # figures drawing in Ray tasks (draw), on the driver only
        # The workload's side process (orchard.background.SideProcess, started by the lifecycle
        # when the workload names SIDE_IMPORTS), on the driver only; None elsewhere.
        self.side = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_on_metrics"] = None
        state["_progress_sent"] = NEVER_SENT
        state["time_split"] = None
        state["_drawings"] = []
        state["side"] = None
        return state

    # ------------------------------------------------------------------ time split
    def mark(self, part: str) -> None:
        """On the driver, as a step ends: the time since the last mark went to ``part``
        (``time/split/<part>_s``, orchard/tracking/time_split.py). Nothing where no split is kept."""
        if self.time_split is not None:
            self.time_split.mark(part)

    def carve(self, whole: str, pieces: dict[str, float]) -> None:
        """Move what the workers measured inside part ``whole`` into parts of their own."""
        if self.time_split is not None:
            self.time_split.carve(whole, pieces)

    # ------------------------------------------------------------------ metrics and params
    def log_metrics(self, metrics: dict[str, float], step: int | None = None, keep_series: bool = False) -> None:
        """Record numeric metrics (``split/name`` keys) at ``step``.

        ``keep_series=True`` also keeps every value in the sink so the core can summarize it
        (mean/std) at the end of the run; used for resource samples.  A name MLflow would refuse
        raises ``ValueError`` here, before anything is sent.
        """
        for key in metrics:
            check_metric_name(key)
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        self._sink.log_metrics.remote(clean, step, int(time.time() * 1000), keep_series)
        if self._on_metrics is not None:
            self._on_metrics(clean, step)

    def log_params(self, params: dict[str, Any]) -> None:
        self._sink.log_params.remote(params)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._sink.set_tags.remote(tags)

    # ------------------------------------------------------------------ artifacts
    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        """Copy a file from the caller's node into the run (``artifact_path`` is a folder)."""
        local_path = Path(local_path)
        name = local_path.name if artifact_path is None else f"{artifact_path.rstrip('/')}/{local_path.name}"
        self._sink.log_artifact_bytes.remote(local_path.read_bytes(), name)

    def log_bytes(self, data: bytes, name: str) -> None:
        self._sink.log_artifact_bytes.remote(data, name)

    def log_text(self, text: str, name: str) -> None:
        self.log_bytes(text.encode(), name)

    def log_dict(self, data: dict, name: str) -> None:
        self.log_text(json.dumps(data, indent=2, default=_jsonable), name)

    def log_figure(self, figure, name: str, dpi: int = 100) -> None:
        """Save a matplotlib figure as a PNG artifact ``name`` (e.g. ``figures/loss.png``)."""
        from orchard.tracking.figures import png_bytes

        self.log_bytes(png_bytes(figure, dpi), name)

    def draw(self, fn: Callable, /, **kwargs):
        """``fn(ctx, **kwargs)`` in a Ray task while the caller goes on: a workload's figures drawn
        beside its model's logging (orchard/tracking/drawing.py). Returns a ``Drawing``, whose
        ``result()`` waits and returns what ``fn`` returned; the run waits for any not waited for."""
        from orchard.tracking import drawing

        started = drawing.start(fn, self, kwargs)
        self._drawings.append(started)
        return started

    def wait_for_drawings(self) -> None:
        """Every ``draw`` of this run done (the lifecycle calls it as the workload returns)."""
        from orchard.tracking import drawing

        drawing.wait_all(self._drawings)

    def claim_gpus(self) -> None:
        """Called by each worker of the run: the GPUs Ray gave it are the ones sampled."""
        import ray

        ids = [int(i) for i in ray.get_gpu_ids() if str(i).isdigit()]
        if ids:
            self._sink.claim_gpus.remote(ray.get_runtime_context().get_node_id(), ids)

    # ------------------------------------------------------------------ progress
    def progress(self, step: int, total: int | None = None, desc: str = "", **rates: float) -> None:
        """Drive the live progress line on the driver: ``step`` of ``total`` with extra rates.

        At most one message per ``PROGRESS_INTERVAL_S`` per process (and always the last
        step): the line redraws a few times a second, so per-step messages would only cost
        the training loop an actor call each."""
        now = time.monotonic()
        if now - self._progress_sent < PROGRESS_INTERVAL_S and step != total:
            return
        self._progress_sent = now
        self._sink.progress.remote({"step": step, "total": total, "desc": desc, "rates": rates, "ts": time.time()})

    # ------------------------------------------------------------------ plumbing
    def flush(self, timeout_s: float | None = None) -> None:
        """Block until everything logged so far is written to the tracking store (or ``timeout_s``
        passed: ``GetTimeoutError``)."""
        import ray

        ray.get(self._sink.flush.remote(), timeout=timeout_s)

    def last_values(self) -> dict[str, float]:
        import ray

        return ray.get(self._sink.last_values.remote())


# Names MLflow accepts on every platform, checked without importing it: ASCII letters, digits and
# _ . - / and spaces (a subset of its rule, which adds colons and non-ASCII word characters off
# Windows), a path that normalizes to itself, within its key length. Anything else goes to
# MLflow's own rules. Why: mlflow.utils.validation loads the whole mlflow package (1.7 s on
# 2 cores), which a Ray Train worker paid in its first logged step (docs/benchmarks/flower.md).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_./\- ]+")
_PLAIN_MAX = 250  # MLflow's MAX_ENTITY_KEY_LENGTH (tests/orchard/tracking/test_sink.py checks they agree)


def _plainly_valid(key) -> bool:
    return (isinstance(key, str) and len(key) <= _PLAIN_MAX and _PLAIN_NAME.fullmatch(key) is not None
            and posixpath.normpath(key) == key and not key.startswith((".", "/")))


def check_metric_name(key) -> None:
    """Raise ``ValueError`` naming ``key`` unless MLflow accepts it as a metric name.

    The rules are MLflow's own (``mlflow.utils.validation``): the store refuses a whole batch for
    one bad name, so a bad name is stopped where it is logged, with the line that logged it.
    Plain names (``_plainly_valid``, a subset of those rules) pass without loading MLflow."""
    if key in _VALID_NAMES:
        return
    if _plainly_valid(key):
        _VALID_NAMES.add(key)
        return
    from mlflow.utils.validation import (MAX_ENTITY_KEY_LENGTH, bad_character_message, bad_path_message,
                                         path_not_unique, validate_param_and_metric_name)

    if not isinstance(key, str):
        why = f"a name must be a string, not {type(key).__name__}"
    elif not validate_param_and_metric_name(key):
        why = bad_character_message()
    elif path_not_unique(key):
        why = bad_path_message(key)
    elif len(key) > MAX_ENTITY_KEY_LENGTH:
        why = f"a name has at most {MAX_ENTITY_KEY_LENGTH} characters; this one has {len(key)}"
    else:
        _VALID_NAMES.add(key)
        return
    shown = repr(key) if len(repr(key)) <= 80 else repr(key)[:76] + "...'"
    raise ValueError(f"metric name {shown} is refused by MLflow: {why.rstrip('.')}")


def _jsonable(value):
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
    except ImportError:
        pass
    return str(value)
