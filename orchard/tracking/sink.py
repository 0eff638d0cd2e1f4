"""The run's metrics sink: one Ray actor that every driver, task, actor and Train worker of a run
writes through, so that a single process talks to the MLflow store (sqlite allows one writer
at a time, and a remote cluster's workers may not reach the store at all).

It also keeps the latest progress report for the driver's progress line and the last value of
every metric for the final summary. Bookkeeping counters (``cache/*``, ``train/workers``, the
node-loss figures while nothing was lost: orchard/tracking/bookkeeping.py) are no charts: it
writes them to the run's ``tables/bookkeeping.json`` instead.

The sink outlives its own death: Ray restarts it (``max_restarts=-1``) and resends the calls
that were in flight (``max_task_retries=-1``); the new instance reloads the last values and the
``system/`` series from the MLflow run.  What is lost is the batch buffered since the last
flush: at most ``flush_interval_s`` (1 s by default) of metrics, and the progress report. For
``WRITE_THROUGH_S`` after a restart every call is written before the next is taken: the calls that
queued while it restarted (a whole run's, when training outran a slow restart) arrive at once,
and a second kill would otherwise find all of them in the buffer.

A busy store (a lock, a database briefly away) keeps metrics buffered and flushes are retried
with backoff; a metric MLflow refuses for what it is (an invalid name or value) is dropped
alone, never retried, and counted in ``sink/dropped_metrics``.  The buffer holds at most
``max_pending`` metrics; past that the oldest go, counted in ``sink/spilled_metrics``.

Memory stays bounded for a run of any length: the series kept in memory (resource samples, for
the run's mean/std; a watched metric, for a sweep's poller) hold at most ``max_series`` points
per key. A resource series past that is thinned (every second point kept, so its mean and spread
stay those of the whole run); a watched metric drops its oldest points (a poller reads within
seconds). The store keeps every point either way.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import ray

from orchard import background
from orchard.tracking import bookkeeping
from orchard.tracking.store import first_line, quiet_store_logs, refused, retried

MAX_BATCH = 900  # MLflow's log_batch takes at most 1000 metrics per call
MAX_PENDING = 100_000  # metrics buffered while the store is away (~25 MB); past it the oldest are spilled
MAX_FLUSH_WAIT_S = 30.0  # the flush timer's longest backoff while the store refuses
MAX_SERIES = 10_000  # points per in-memory series (~5.5 h of resource samples every 2 s); the store keeps all
WRITE_THROUGH_S = 30.0  # after a restart, each call written at once for this long (the backlog's drain)


def _restarted() -> bool:
    """This actor is a restart of one that died (Ray's own flag; its getter warns about an
    internal call of its own, which would reach the user's console)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def sink_name(run_key: str) -> str:
    """A run's sink is a named actor, so operators and the fault tests can find it:
    ``orchard-sink-<run id>``."""
    return f"orchard-sink-{run_key}"
DROPPED, SPILLED = "sink/dropped_metrics", "sink/spilled_metrics"


# os.nice increment of the sink's process (Ray's workers run at 15, the sink at 19): nothing
# waits on its writes, the run's workers wait on their CPU
NICENESS = 10


# Writers run one at a time in submission order ("write"), so ``flush`` after a caller's
# ``log_metrics`` sees them; readers ("read") answer the progress line without waiting on writes.
@ray.remote(num_cpus=0, concurrency_groups={"write": 1, "read": 2}, max_restarts=-1, max_task_retries=-1)
class MetricsSink:
    """Buffers metrics and writes them to one MLflow run every ``flush_interval_s`` seconds."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, flush_interval_s: float = 1.0,
                 max_pending: int = MAX_PENDING, max_series: int = MAX_SERIES, watch: tuple = ()):
        # a background writer: its start (MLflow's import, the store's engine: seconds of CPU)
        # and its flushes yield to the run's own processes where cores are short
        os.nice(NICENESS)
        self._run_id = run_id
        self._max_series = max(2, int(max_series))
        self._client = None
        if tracking_uri and run_id:
            from mlflow.tracking import MlflowClient

            quiet_store_logs()  # a lock is reported by the flush in one line, not MLflow's traceback
            self._client = MlflowClient(tracking_uri)
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._pending: list = []
        self._last: dict[str, float] = {}
        self._series: dict[str, list[float]] = {}
        self._progress: dict = {}
        self._last_step: dict[str, int] = {}
        self._gpus: dict[str, set[int]] = {}
        # key -> its latest (step, value)s, for ``logged_since`` (a sweep trial polls its metric,
        # wherever the run logs it). ``watch`` names them from the sink's start: a trial's feed
        # used to wait ~2.5 s for this process to answer a call naming them before its workload
        # began. A restarted sink leaves them to ``_logged_since``: the store has their history
        self._watched: dict[str, list[tuple[int, float]]] = {}
        self._watched_dropped: dict[str, int] = {}              # key -> how many of its oldest went (bound)
        self._ledger = bookkeeping.Ledger()  # counters kept out of the charts (orchard/tracking/bookkeeping.py)
        self._max_pending = max_pending
        self._lost = {DROPPED: 0, SPILLED: 0}  # totals for the run; a restarted sink goes on from the store's
        self._lost_sent = dict(self._lost)     # the totals already handed to a flush
        self._warned: set[str] = set()         # say once per key (and once for the spill), not per flush
        self._interval = flush_interval_s
        self._write_through_until = 0.0
        if self._client is not None:
            self._reload()  # nothing yet for a new run; after a restart, what reached the store
            if _restarted():
                self._write_through_until = time.monotonic() + WRITE_THROUGH_S
        if self._client is None or not _restarted():
            self._watched.update({key: [] for key in watch})
        self._flusher = background.Poller(self._flush_tick, flush_interval_s, "orchard-metrics-flush")
        self._flusher.start()

    # ------------------------------------------------------------------ writers
    @ray.method(concurrency_group="write")
    def log_metrics(self, metrics: dict[str, float], step: int | None, timestamp_ms: int, keep_series: bool = False) -> None:
        from mlflow.entities import Metric

        with self._lock:
            for key, value in metrics.items():
                value = float(value)
                self._last[key] = value
                self._last_step[key] = max(int(step or 0), self._last_step.get(key, 0))
                if keep_series:
                    self._keep(key, value)
                if key in self._watched:
                    self._watch_point(key, (int(step or 0), value))
                routed = self._ledger.route(Metric(key, value, timestamp_ms, int(step or 0)))
                if self._client is not None:
                    self._pending.extend(routed)
            self._spill()
        if time.monotonic() < self._write_through_until:
            try:
                self.flush()
            except Exception:  # the store is busy: the timer's flush retries it, as usual
                pass

    def _keep(self, key: str, value: float) -> None:
        """Append to a resource series; past ``max_series`` points, thin it to every second one."""
        series = self._series.setdefault(key, [])
        series.append(value)
        if len(series) > self._max_series:
            self._series[key] = series[::2]

    def _watch_point(self, key: str, point: tuple[int, float]) -> None:
        """Append to a watched metric; past ``max_series`` points its oldest go (counted, so
        ``logged_since`` indices stay those of every point logged)."""
        points = self._watched[key]
        points.append(point)
        extra = len(points) - self._max_series
        if extra > 0:
            del points[:extra]
            self._watched_dropped[key] = self._watched_dropped.get(key, 0) + extra

    @ray.method(concurrency_group="write")
    def log_final(self, metrics: dict[str, float], timestamp_ms: int) -> None:
        """The run's closing values, at its last step (a chart must not jump back to step 0);
        a key whose last logged value is already this one is not logged again."""
        fresh = {k: float(v) for k, v in metrics.items() if self._last.get(k) != float(v)}
        self.log_metrics(fresh, self._run_step(), timestamp_ms)

    def _run_step(self) -> int:
        # resource samples count their own steps (one per sample): the run's steps are the rest
        return max((v for k, v in self._last_step.items() if not k.startswith("system/")), default=0)

    @ray.method(concurrency_group="write")
    def claim_gpus(self, node: str, gpu_ids: list[int]) -> None:
        """A worker of this run holds these GPUs of ``node`` (Ray node id): only they are sampled."""
        with self._lock:
            self._gpus.setdefault(node, set()).update(int(i) for i in gpu_ids)

    @ray.method(concurrency_group="read")
    def claimed_gpus(self, node: str) -> list[int]:
        with self._lock:
            return sorted(self._gpus.get(node, ()))

    def _reload(self) -> None:
        """After a restart: the last values and the system series, from what reached the store."""
        run = retried(self._client.get_run, self._run_id)
        self._last.update(run.data.metrics)
        kept = bookkeeping.read(self._client, self._run_id)
        self._ledger = bookkeeping.Ledger(kept, [k for k in run.data.metrics if bookkeeping.is_event(k)])
        self._last.update(kept)
        for key in self._lost:
            self._lost[key] = self._lost_sent[key] = int(run.data.metrics.get(key, 0))
        for key in run.data.metrics:
            history = retried(self._client.get_metric_history, self._run_id, key)
            self._last_step[key] = max((m.step for m in history), default=0)
            if key.startswith("system/"):
                for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
                    self._keep(key, m.value)

    @ray.method(concurrency_group="write")
    def log_params(self, params: dict) -> None:
        if self._client is None:
            return
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            try:
                retried(self._client.log_batch, self._run_id, params=items[i:i + 100])
            except Exception as exc:
                if not refused(exc):  # the store itself stayed away: one by one would only wait longer
                    print(f"orchard: {len(items) - i} param(s) not logged: {first_line(exc)}")
                    return
                # MLflow params are write-once: a key that already holds another value (e.g. a
                # config key) is refused. Log the rest one by one and say which were skipped.
                for item in items[i:i + 100]:
                    try:
                        retried(self._client.log_param, self._run_id, item.key, item.value)
                    except Exception as err:
                        print(f"orchard: param {item.key!r} not logged: {first_line(err)}")

    @ray.method(concurrency_group="write")
    def set_tags(self, tags: dict) -> None:
        if self._client is None:
            return
        from mlflow.entities import RunTag

        retried(self._client.log_batch, self._run_id, tags=[RunTag(str(k), str(v)[:5000]) for k, v in tags.items()])

    @ray.method(concurrency_group="write")
    def log_artifact_bytes(self, data: bytes, artifact_path: str) -> None:
        """Store ``data`` as the artifact ``artifact_path`` (e.g. ``figures/density.png``)."""
        if self._client is None:
            return
        folder, name = os.path.split(artifact_path)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(data)
            retried(self._client.log_artifact, self._run_id, str(path), folder or None)

    @ray.method(concurrency_group="write")
    def progress(self, report: dict) -> None:
        with self._lock:
            self._progress = report

    # ------------------------------------------------------------------ readers
    @ray.method(concurrency_group="read")
    def logged_since(self, key: str, start: int = 0) -> list[tuple[int, float]]:
        """The watched ``key``'s ``(step, value)`` pairs from the ``start``-th on."""
        return self._logged_since(key, start)

    @ray.method(concurrency_group="read")
    def logged_since_each(self, starts: dict[str, int]) -> dict[str, list[tuple[int, float]]]:
        """``logged_since`` of several keys in one call: ``{key: start}`` -> ``{key: pairs}``."""
        return {key: self._logged_since(key, start) for key, start in starts.items()}

    def _logged_since(self, key: str, start: int) -> list[tuple[int, float]]:
        with self._lock:
            if key not in self._watched and self._client is not None:
                # a restarted sink forgot its watch list: what reached the store is the history
                history = sorted(retried(self._client.get_metric_history, self._run_id, key),
                                 key=lambda m: (m.step, m.timestamp))
                self._watched[key] = []
                for m in history:
                    self._watch_point(key, (int(m.step), float(m.value)))
            return list(self._watched.get(key, ()))[max(0, start - self._watched_dropped.get(key, 0)):]

    @ray.method(concurrency_group="read")
    def get_progress(self) -> dict:
        with self._lock:
            return dict(self._progress)

    @ray.method(concurrency_group="read")
    def last_values(self) -> dict[str, float]:
        with self._lock:
            return dict(self._last)

    @ray.method(concurrency_group="read")
    def series(self, prefix: str = "") -> dict[str, list[float]]:
        with self._lock:
            return {k: list(v) for k, v in self._series.items() if k.startswith(prefix)}

    # ------------------------------------------------------------------ flushing
    @ray.method(concurrency_group="write")
    def flush(self) -> int:
        """Write everything buffered; returns the number of metrics written.  A transient refusal
        (sqlite locked by another run's writes, a database briefly away) puts what is unwritten
        back at the front of the buffer and raises; metrics MLflow refuses for what they are
        are dropped and counted, and the rest written."""
        with self._flushing:  # the timer thread and close() write in turn, in order
            with self._lock:
                batch, self._pending = self._pending, []
            if self._client is None:
                return 0
            written = self._write(batch)
            counts = self._counts()  # what this flush (or the buffer's bound) lost since the last count
            if counts:
                written += self._write(counts)
            self._write_bookkeeping()
            return written

    def _write_bookkeeping(self) -> None:
        """``tables/bookkeeping.json``, when a counter in it changed since it was last written."""
        with self._lock:
            if not self._ledger.dirty:
                return
            values = self._ledger.snapshot()
        try:
            self.log_artifact_bytes(json.dumps(values, indent=2).encode(), bookkeeping.ARTIFACT)
        except Exception:
            with self._lock:
                self._ledger.dirty = True  # the next flush writes it again
            raise

    def _write(self, batch: list) -> int:
        """``log_batch`` in chunks.  A chunk MLflow refuses is halved until each refused metric
        stands alone (about 20 calls for one bad metric in 900), and that metric is dropped."""
        todo = [batch[i:i + MAX_BATCH] for i in range(0, len(batch), MAX_BATCH)][::-1]  # a stack, next on top
        written = 0
        while todo:
            chunk = todo.pop()
            try:
                self._client.log_batch(self._run_id, metrics=chunk)
                written += len(chunk)
            except Exception as exc:
                if not refused(exc):  # the store, not the metrics: all of it waits for the next flush
                    with self._lock:
                        self._pending[:0] = [m for part in [chunk, *todo[::-1]] for m in part]
                        self._spill()
                    raise
                if len(chunk) == 1:
                    self._drop(chunk[0], exc)
                else:
                    half = len(chunk) // 2
                    todo += [chunk[half:], chunk[:half]]
        return written

    def _drop(self, metric, exc: BaseException) -> None:
        with self._lock:
            self._count(DROPPED, 1)
            if metric.key not in self._warned:
                self._warned.add(metric.key)
                print(f"orchard: metric {metric.key!r} refused by the tracking store and dropped "
                      f"(counted in {DROPPED}): {first_line(exc)}")

    def _spill(self) -> None:
        """Hold the buffer to ``max_pending``: the oldest metrics go, counted.  Called with the lock held."""
        excess = len(self._pending) - self._max_pending
        if excess <= 0:
            return
        del self._pending[:excess]
        self._count(SPILLED, excess)
        if SPILLED not in self._warned:
            self._warned.add(SPILLED)
            print(f"orchard: the tracking store has not taken metrics for a while; beyond {self._max_pending} "
                  f"buffered the oldest are dropped (counted in {SPILLED})")

    def _count(self, key: str, n: int) -> None:
        self._lost[key] += n
        self._last[key] = float(self._lost[key])  # the summary shows it too

    def _counts(self) -> list:
        """The loss totals that changed since last handed to a flush, as metrics at the run's step."""
        from mlflow.entities import Metric

        with self._lock:
            fresh = {k: n for k, n in self._lost.items() if n != self._lost_sent[k]}
            self._lost_sent.update(fresh)
            now, step = int(time.time() * 1000), self._run_step()
            return [Metric(k, float(n), now, step) for k, n in fresh.items()]

    def _flush_tick(self) -> None:
        try:
            self.flush()
            self._flusher.every_s = self._interval
        except Exception as exc:  # kept for the next flush, later and later; close() reports if the store stays away
            self._flusher.every_s = min(self._flusher.every_s * 2, MAX_FLUSH_WAIT_S)
            print(f"orchard: metrics flush failed, will retry in {self._flusher.every_s:g} s: {first_line(exc)}")

    @ray.method(concurrency_group="write")
    def close(self) -> int:
        """The last flush, retried with backoff while the store is busy, before the caller hears of it."""
        self._flusher.stop(timeout_s=0)
        return retried(self.flush)

    @ray.method(concurrency_group="read")
    def ping(self) -> float:
        return time.time()
