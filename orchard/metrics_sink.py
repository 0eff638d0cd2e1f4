"""The run's metrics sink: one Ray actor that every driver, task, actor and Train worker of a run
writes through, so that a single process talks to the MLflow store (sqlite allows one writer
at a time, and a remote cluster's workers may not reach the store at all).

It also keeps the latest progress report for the driver's progress line and the last value of
every metric for the final summary.

The sink outlives its own death: Ray restarts it (``max_restarts=-1``) and resends the calls
that were in flight (``max_task_retries=-1``); the new instance reloads the last values and the
``system/`` series from the MLflow run.  What is lost is the batch buffered since the last
flush: at most ``flush_interval_s`` (1 s by default) of metrics, and the progress report.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import ray

MAX_BATCH = 900  # MLflow's log_batch takes at most 1000 metrics per call


# Writers run one at a time in submission order ("write"), so ``flush`` after a caller's
# ``log_metrics`` sees them; readers ("read") answer the progress line without waiting on writes.
@ray.remote(num_cpus=0, concurrency_groups={"write": 1, "read": 2}, max_restarts=-1, max_task_retries=-1)
class MetricsSink:
    """Buffers metrics and writes them to one MLflow run every ``flush_interval_s`` seconds."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, flush_interval_s: float = 1.0):
        self._run_id = run_id
        self._client = None
        if tracking_uri and run_id:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri)
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._pending: list = []
        self._last: dict[str, float] = {}
        self._series: dict[str, list[float]] = {}
        self._progress: dict = {}
        self._last_step: dict[str, int] = {}
        self._gpus: dict[str, set[int]] = {}
        self._watched: dict[str, list[tuple[int, float]]] = {}  # key -> every (step, value), for pollers
        self._interval = flush_interval_s
        if self._client is not None:
            self._reload()  # nothing yet for a new run; after a restart, what reached the store
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
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
                    self._series.setdefault(key, []).append(value)
                if key in self._watched:
                    self._watched[key].append((int(step or 0), value))
                if self._client is not None:
                    self._pending.append(Metric(key, value, timestamp_ms, int(step or 0)))

    @ray.method(concurrency_group="write")
    def log_final(self, metrics: dict[str, float], timestamp_ms: int) -> None:
        """The run's closing values, at its last step (a chart must not jump back to step 0);
        a key whose last logged value is already this one is not logged again."""
        # resource samples count their own steps (one per sample): the run's steps are the rest
        step = max((v for k, v in self._last_step.items() if not k.startswith("system/")), default=0)
        fresh = {k: float(v) for k, v in metrics.items() if self._last.get(k) != float(v)}
        self.log_metrics(fresh, step, timestamp_ms)

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
        run = self._client.get_run(self._run_id)
        self._last.update(run.data.metrics)
        for key in run.data.metrics:
            history = self._client.get_metric_history(self._run_id, key)
            self._last_step[key] = max((m.step for m in history), default=0)
            if key.startswith("system/"):
                self._series[key] = [m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))]

    @ray.method(concurrency_group="write")
    def log_params(self, params: dict) -> None:
        if self._client is None:
            return
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            try:
                self._client.log_batch(self._run_id, params=items[i:i + 100])
            except Exception:
                # MLflow params are write-once: a key that already holds another value (e.g. a
                # config key) is refused. Log the rest one by one and say which were skipped.
                for item in items[i:i + 100]:
                    try:
                        self._client.log_param(self._run_id, item.key, item.value)
                    except Exception as exc:
                        print(f"orchard: param {item.key!r} not logged: {str(exc).splitlines()[0][:200]}")

    @ray.method(concurrency_group="write")
    def set_tags(self, tags: dict) -> None:
        if self._client is None:
            return
        from mlflow.entities import RunTag

        self._client.log_batch(self._run_id, tags=[RunTag(str(k), str(v)[:5000]) for k, v in tags.items()])

    @ray.method(concurrency_group="write")
    def log_artifact_bytes(self, data: bytes, artifact_path: str) -> None:
        """Store ``data`` as the artifact ``artifact_path`` (e.g. ``figures/density.png``)."""
        if self._client is None:
            return
        folder, name = os.path.split(artifact_path)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(data)
            self._client.log_artifact(self._run_id, str(path), folder or None)

    @ray.method(concurrency_group="write")
    def progress(self, report: dict) -> None:
        with self._lock:
            self._progress = report

    @ray.method(concurrency_group="write")
    def watch(self, key: str) -> None:
        """Keep every ``(step, value)`` of ``key`` logged from now on, for ``logged_since``
        (a sweep trial polls its metric, wherever the run logs it)."""
        with self._lock:
            self._watched.setdefault(key, [])

    # ------------------------------------------------------------------ readers
    @ray.method(concurrency_group="read")
    def logged_since(self, key: str, start: int = 0) -> list[tuple[int, float]]:
        """The watched ``key``'s ``(step, value)`` pairs from the ``start``-th on."""
        with self._lock:
            if key not in self._watched and self._client is not None:
                # a restarted sink forgot its watch list: what reached the store is the history
                history = sorted(self._client.get_metric_history(self._run_id, key), key=lambda m: (m.step, m.timestamp))
                self._watched[key] = [(int(m.step), float(m.value)) for m in history]
            return list(self._watched.get(key, ()))[start:]

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
        """Write everything buffered; returns the number of metrics written.  What the store
        refused (sqlite busy with another run's writes, a tracking server restarting) goes
        back to the front of the buffer for the next flush: a failed write loses nothing."""
        with self._flushing:  # the timer thread and close() write in turn, in order
            with self._lock:
                batch, self._pending = self._pending, []
            if self._client is None:
                return 0
            sent = 0
            try:
                for i in range(0, len(batch), MAX_BATCH):
                    self._client.log_batch(self._run_id, metrics=batch[i:i + MAX_BATCH])
                    sent = min(i + MAX_BATCH, len(batch))
            except Exception:
                with self._lock:
                    self._pending = batch[sent:] + self._pending
                raise
            return len(batch)

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception as exc:  # kept for the next flush; close() reports if the store stays away
                print(f"orchard: metrics flush failed, will retry: {exc}")

    @ray.method(concurrency_group="write")
    def close(self, attempts: int = 6) -> int:
        """The last flush, retried with backoff (1, 2, 4, ... s) before the caller hears of it."""
        self._stop.set()
        for attempt in range(attempts - 1):
            try:
                return self.flush()
            except Exception:
                time.sleep(2 ** attempt)
        return self.flush()

    @ray.method(concurrency_group="read")
    def ping(self) -> float:
        return time.time()
