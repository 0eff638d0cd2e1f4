"""The run's metrics sink: one Ray actor that every driver, task, actor and Train worker of a run
writes through, so that a single process talks to the MLflow store (sqlite allows one writer
at a time, and a remote cluster's workers may not reach the store at all).

It also keeps the latest progress report for the driver's progress line and the last value of
every metric for the final summary.
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
@ray.remote(num_cpus=0, concurrency_groups={"write": 1, "read": 2})
class MetricsSink:
    """Buffers metrics and writes them to one MLflow run every ``flush_interval_s`` seconds."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, flush_interval_s: float = 1.0):
        self._run_id = run_id
        self._client = None
        if tracking_uri and run_id:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri)
        self._lock = threading.Lock()
        self._pending: list = []
        self._last: dict[str, float] = {}
        self._series: dict[str, list[float]] = {}
        self._progress: dict = {}
        self._interval = flush_interval_s
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
                if keep_series:
                    self._series.setdefault(key, []).append(value)
                if self._client is not None:
                    self._pending.append(Metric(key, value, timestamp_ms, int(step or 0)))

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

    # ------------------------------------------------------------------ readers
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
        """Write everything buffered; returns the number of metrics written."""
        with self._lock:
            batch, self._pending = self._pending, []
        if self._client is None:
            return 0
        for i in range(0, len(batch), MAX_BATCH):
            self._client.log_batch(self._run_id, metrics=batch[i:i + MAX_BATCH])
        return len(batch)

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception as exc:  # keep sampling; the final flush raises if the store is gone
                print(f"orchard: metrics flush failed, will retry: {exc}")

    @ray.method(concurrency_group="write")
    def close(self) -> int:
        self._stop.set()
        return self.flush()

    @ray.method(concurrency_group="read")
    def ping(self) -> float:
        return time.time()
