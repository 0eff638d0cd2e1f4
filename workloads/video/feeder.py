"""The feeder: one streaming pipeline for the whole training, dealt to every stream's trainers.

Decode once: the pipeline (pipeline.py) carries every stream's feature for every segment
of every epoch, in segment order. The feeder, a thread on the driver, cuts it into the
streams' global batches (never across an epoch), splits each batch evenly over a stream's
workers and puts each worker's part in that worker's bounded queue (queues.py: one actor holds
every queue of the run), followed by an end-of-epoch mark after each epoch. Each stream's Ray
Train run reads its own queues for all epochs (train.py): one run per stream, no relaunch per
epoch.

Backpressure: a full queue blocks the feeder, which stops pulling from the pipeline,
which Ray Data then holds back within its object-store budget. That budget can hold many
batches, and until it fills the decoders go on taking cores the trainers need; so when a
queue stays full for a second the feeder also **pauses decoding** at the master (the notes'
"pause/resume Decoding": the master holds the segments back before the decode stage) and resumes it as soon
as the trainers take a batch again (`pipeline/decode_pauses`, `pipeline/decode_paused_s`;
`video.pause_decode=false` leaves it to Ray Data alone). Determinism: rows arrive in order
and are dealt by position, so every worker of every stream sees the same batches run after
run, whatever the timing (a pause changes when a batch is decoded, never which).

Worker shifting (``video.shift_apply``): the driver asks for new worker counts with
``request_resize``; the feeder applies them at the start of the next epoch it has not begun to
deal. There it sends the resized streams' workers a resize mark (their Train runs end after the
epoch they finished), waits for the driver to relaunch those streams and ``hand_over`` their new
queues, and deals on. Batches are cut per stream before the split over workers, so the batches a
stream sees do not change with its worker count; only their split does.
"""
from __future__ import annotations

import threading
import time

import numpy as np

END = "end_of_epoch"
STOP = "stop_training"   # the run ended training early (video.target_top1 reached)
RESIZE = "resize"        # this stream's run ends here; it is relaunched with another worker count
AHEAD = -1               # the epoch of rows set aside for the driver ahead of epoch 0 (the validation segments)
AFTER = 1 << 30          # ... and after the last epoch (the untrimmed videos' windows, for inference)


class Stopped(RuntimeError):
    """The run is ending (a trainer failed or the run was interrupted): stop feeding."""


class _Finished(Exception):
    """The target was met while the feeder waited for relaunched streams."""


class Feeder:
    """Deals the pipeline's rows to the streams' worker queues; keeps its own wait figures.

    ``streams``: stream -> feature column; ``queues``: stream -> one queue per worker;
    ``batch_size``: a stream's global batch (split over its workers); ``epochs``: how many
    end-of-epoch marks to send (every epoch gets one, even one whose segments all failed);
    ``first_epoch``: the first epoch the pipeline carries (a resumed run deals only the rest);
    ``aside``: for the rows whose epoch is ``AHEAD`` or ``AFTER``, the columns the feeder keeps for
    the driver (``set_aside``) rather than deal: the validation segments and the inference windows
    ride the training pipeline, so its actor pools start once for all three (a Ray Data execution
    starts its actors as new processes, the cost of a pass). ``AFTER`` rows end the last epoch.
    """

    def __init__(self, streams: dict[str, str], queues: dict[str, list], batch_size: int, epochs: int,
                 first_epoch: int = 0, master=None, aside: dict[int, list[str]] | None = None):
        self.streams, self.queues, self.batch_size, self.epochs = streams, queues, batch_size, epochs
        self.master = master              # the decode control (master.py); None: never pause
        self.stop = threading.Event()      # the run is failing: drop everything
        self.finish = threading.Event()    # the run met its target: tell the trainers to stop
        self.error: BaseException | None = None
        self.wait_pipeline_s = 0.0    # blocked on the pipeline: the trainers may starve
        self.wait_trainers_s = 0.0    # blocked on a full queue: the pipeline is ahead
        self.batches = 0
        self.pauses = 0               # times decoding was paused because the trainers were behind
        self.paused_s = 0.0           # and for how long in all
        self._paused_at: float | None = None
        self._control = 0             # the number of the last pause or resume sent to the master
        self._epoch = first_epoch
        # worker shifting: {"epoch", "alloc"} asked by the driver, the queues it hands over
        self._lock = threading.Lock()
        self._resize: dict | None = None
        self._handed: dict[str, list] | None = None
        self._handed_ready = threading.Event()
        self.resize_wait_s = 0.0      # dealing held while resized streams were relaunched
        self._aside = {mark: {c: [] for c in columns} for mark, columns in (aside or {}).items()}
        self._passed = {mark: threading.Event() for mark in self._aside}   # every such row has passed
        self._drained = False         # the pipeline ran out (not stopped, failed or finished early)
        self._aside_span = {mark: [None, None] for mark in self._aside}   # first and last arrival of such rows

    # -- decode control -------------------------------------------------------------------
    def _pause_decoding(self) -> None:
        """The trainers are a full queue behind: hold the segments back at the master, before decoding."""
        if self.master is not None and self._paused_at is None:
            self._control += 1   # numbered: the master applies them in this order (Master._in_order)
            self.master.pause.remote(self._control)
            self._paused_at = time.perf_counter()
            self.pauses += 1

    def _resume_decoding(self) -> None:
        """The trainers took a batch again (or feeding ends): let the decoders go on."""
        if self._paused_at is not None:
            self.paused_s += time.perf_counter() - self._paused_at
            self._paused_at = None
            self._control += 1
            self.master.resume.remote(self._control)

    # -- dealing ------------------------------------------------------------------------
    def _put(self, q, item) -> None:
        from ray.util.queue import Full

        t0 = time.perf_counter()
        while True:
            if self.stop.is_set():
                raise Stopped("feeder stopped")
            try:
                q.put(item, block=True, timeout=1.0)
                break
            except Full:
                self._pause_decoding()
                continue
        self._resume_decoding()
        self.wait_trainers_s += time.perf_counter() - t0

    def _emit(self, rows: dict[str, np.ndarray]) -> None:
        n = len(rows["label"])
        if n == 0:
            return
        for stream, feature in self.streams.items():
            parts = np.array_split(np.arange(n), len(self.queues[stream]))
            if min(len(p) for p in parts) == 0:
                return  # fewer rows than workers (a dropped segment at an epoch's end): skip them all
        for stream, feature in self.streams.items():
            parts = np.array_split(np.arange(n), len(self.queues[stream]))
            for q, part in zip(self.queues[stream], parts):
                self._put(q, {"x": rows[feature][part], "y": rows["label"][part]})
        self.batches += 1

    def _end_epochs(self, until: int) -> None:
        """End-of-epoch marks for every epoch before ``until``; a resize asked for the next epoch
        is applied right after its mark."""
        while self._epoch < until:
            for qs in self.queues.values():
                for q in qs:
                    self._put(q, (END, self._epoch))
            with self._lock:
                self._epoch += 1
                resize = self._resize if self._resize and self._resize["epoch"] == self._epoch else None
            if resize is not None and self._epoch < self.epochs:
                self._apply_resize(resize["alloc"])

    # -- worker shifting -----------------------------------------------------------------
    def request_resize(self, alloc: dict[str, int]) -> int | None:
        """New worker counts for some streams, from the next epoch the feeder has not begun to
        deal; returns that epoch (the driver relaunches those streams once the one before it is
        trained), or None when no epoch is left to deal."""
        with self._lock:
            if self._resize is not None:
                return None                # one shift at a time: the driver asks again later
            epoch = self._epoch + 1
            if epoch >= self.epochs:
                return None
            self._resize = {"epoch": epoch, "alloc": dict(alloc)}
            return epoch

    def hand_over(self, queues: dict[str, list]) -> None:
        """The relaunched streams' new queues (one per worker): dealing goes on."""
        self._handed = queues
        self._handed_ready.set()

    def _apply_resize(self, alloc: dict[str, int]) -> None:
        t0 = time.perf_counter()
        for stream in alloc:
            for q in self.queues[stream]:
                self._put(q, (RESIZE, self._epoch))
        while not self._handed_ready.wait(0.5):
            if self.stop.is_set():
                raise Stopped("feeder stopped while streams were relaunched")
            if self.finish.is_set():
                raise _Finished()         # target met meanwhile: the rest get their stop marks
        self._handed_ready.clear()
        self.queues = {**self.queues, **self._handed}
        with self._lock:
            self._resize, self._handed = None, None
        self.resize_wait_s += time.perf_counter() - t0

    def set_aside(self, mark: int = AHEAD) -> dict[str, np.ndarray] | None:
        """The rows of epoch ``mark`` set aside, once the pipeline has passed them all. ``AHEAD`` rows
        come before epoch 0: by the time a stream has trained an epoch they are here. ``AFTER`` rows
        are whole only once the pipeline ran out: None if it did not (training stopped early)."""
        while not self._passed[mark].wait(0.5):
            if self.stop.is_set():
                raise Stopped("feeder stopped")
        if self.error is not None:
            raise RuntimeError(f"the pipeline failed before the rows set aside passed: {self.error}") \
                from self.error
        if mark == AFTER and not self._drained:
            return None
        return {c: np.concatenate(v) if v else np.zeros((0,)) for c, v in self._aside[mark].items()}

    def aside_seconds(self, mark: int) -> float:
        """Seconds from the first row set aside for ``mark`` reaching the feeder to the last one (0
        if none came): the time the pipeline spent on those rows, as the driver sees it."""
        first, last = self._aside_span[mark]
        return (last - first) if first is not None else 0.0

    def _pass(self, epoch: int) -> None:
        """A row of ``epoch`` arrived: every set-aside epoch before it has passed (rows are in order)."""
        for mark, passed in self._passed.items():
            if mark < epoch:
                passed.set()

    def run(self, batches) -> None:
        """Feed from an iterator of numpy batches with an ``epoch`` column (rows in epoch order)."""
        columns = ["label", *sorted(set(self.streams.values()))]
        buffer: dict[str, list] = {c: [] for c in columns}
        held = 0

        def flush(limit: int | None) -> None:
            nonlocal buffer, held
            if not held:
                return
            joined = {c: np.concatenate(v) for c, v in buffer.items()}
            while held and (limit is None or held >= limit):
                take = held if limit is None else limit
                self._emit({c: v[:take] for c, v in joined.items()})
                joined = {c: v[take:] for c, v in joined.items()}
                held -= take
            buffer = {c: [v] if len(v) else [] for c, v in joined.items()}

        it = iter(batches)
        try:
            while not self.finish.is_set():
                t0 = time.perf_counter()
                batch = next(it, None)
                if self._epoch < self.epochs:   # not the wait for rows after the last epoch: no trainer waits on it
                    self.wait_pipeline_s += time.perf_counter() - t0
                if batch is None:
                    self._drained = True
                    break
                epochs = batch["epoch"]
                for e in np.unique(epochs):   # rows come in epoch order (preserve_order)
                    rows = epochs == e
                    self._pass(int(e))
                    if e in self._aside:
                        if e == AFTER:        # every epoch's rows have come: the last one ends now
                            flush(None)
                            self._end_epochs(self.epochs)
                        for c, parts in self._aside[e].items():
                            parts.append(batch[c][rows])
                        span = self._aside_span[e]
                        span[0], span[1] = span[0] or t0, time.perf_counter()
                        continue
                    if e > self._epoch:
                        flush(None)           # the epoch's last, smaller batch
                        self._end_epochs(int(e))
                    for c in columns:
                        buffer[c].append(batch[c][rows])
                    held += int(rows.sum())
                    flush(self.batch_size)
            if not self.finish.is_set():
                flush(None)
                self._end_epochs(self.epochs)
        except _Finished:  # the target was met while relaunched streams were awaited
            pass
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, which fails the run
            self.error = exc
            return
        finally:
            for passed in self._passed.values():
                passed.set()
            try:  # never leave the decoders paused: validation and inference pass the same release
                self._resume_decoding()
            except Exception:  # noqa: BLE001 - Ray is going down with an interrupted run
                pass
            # a pipeline left mid-way (stopped, failed, target met) is closed here: its Ray Data
            # threads would otherwise go on calling Ray after the run has stopped it
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if self.finish.is_set():  # the target was met: every trainer stops at its next batch
            try:
                for qs in self.queues.values():
                    for q in qs:
                        self._put(q, (STOP, self._epoch))
            except Stopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - as above
                self.error = exc

    def start(self, batches):
        """Deal ``batches`` on a thread the run lifecycle waits for (orchard/background.py); a Future."""
        from orchard.api import background

        return background.start(self.run, batches, name="video-feeder")
