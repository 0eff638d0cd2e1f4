"""The feeder deals one in-order pipeline to every stream's workers: same batches every time."""
from __future__ import annotations

import numpy as np
import pytest


def _batches(epochs: int, rows: int, size: int):
    """Pipeline batches (not aligned to epochs) with an ``epoch`` column and two feature columns."""
    ids = np.arange(epochs * rows)
    data = {"epoch": ids // rows, "label": ids % 3, "f1": ids * 10, "f2": ids * 100}
    return [{k: v[i:i + size] for k, v in data.items()} for i in range(0, len(ids), size)]


def _drain(queue) -> list:
    from workloads.video.feeder import END

    out = []
    while True:
        item = queue.get(timeout=60)
        out.append(item if isinstance(item, tuple) else (item["x"].tolist(), item["y"].tolist()))
        if isinstance(item, tuple) and item[0] == END and item[1] == 1:
            return out


def test_batches_never_cross_an_epoch_and_split_evenly_over_workers(ray_session):
    import threading

    from workloads.video.feeder import END, Feeder
    from workloads.video.queues import make_queues, shutdown_queues

    queues = make_queues({"spatial": 1, "temporal": 2}, depth=2)     # small: the feeder must wait
    feeder = Feeder({"spatial": "f1", "temporal": "f2"}, queues, batch_size=4, epochs=2)
    got = {}
    readers = [threading.Thread(target=lambda k=k, q=q: got.__setitem__(k, _drain(q)))
               for k, q in (("s0", queues["spatial"][0]), ("t0", queues["temporal"][0]),
                            ("t1", queues["temporal"][1]))]
    for r in readers:
        r.start()
    feeder.run(_batches(epochs=2, rows=10, size=3))
    for r in readers:
        r.join(60)
    shutdown_queues(queues)
    assert feeder.error is None
    # spatial, one worker: 4 + 4 + 2 rows per epoch, then the epoch's end mark
    assert [x for x, _ in got["s0"][:3]] == [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]
    assert got["s0"][3] == (END, 0) and got["s0"][-1] == (END, 1)
    assert got["s0"][4][0] == [100, 110, 120, 130]                    # epoch 1 starts a fresh batch
    # temporal, two workers: each global batch halved, in order
    assert [x for x, _ in got["t0"][:3]] == [[0, 100], [400, 500], [800]]
    assert [x for x, _ in got["t1"][:3]] == [[200, 300], [600, 700], [900]]
    assert feeder.wait_trainers_s >= 0 and feeder.batches == 6


def test_rows_ahead_of_epoch_0_and_after_the_last_are_set_aside_and_the_epochs_dealt_as_without_them(ray_session):
    """The validation segments and the inference windows ride the training pipeline: rows of epoch
    AHEAD come first, rows of epoch AFTER last (here batches share them with epoch 0's first rows and
    epoch 1's last); the feeder keeps them for the driver and deals the epochs exactly as it would
    without them, the last epoch's end mark included."""
    import threading

    from workloads.video.feeder import AFTER, AHEAD, Feeder
    from workloads.video.queues import make_queues, shutdown_queues

    def run(ahead: int, after: int):
        plain = _batches(epochs=2, rows=10, size=20)[0]
        data = {k: np.concatenate([np.full(ahead, AHEAD) if k == "epoch" else -np.arange(1, ahead + 1), v,
                                   np.full(after, AFTER) if k == "epoch" else 1000 + np.arange(after)])
                for k, v in plain.items()}
        batches = [{k: v[i:i + 3] for k, v in data.items()} for i in range(0, len(data["label"]), 3)]
        queues = make_queues({"spatial": 1}, depth=2)
        aside = {AHEAD: ["f2", "label"], AFTER: ["f2"]} if ahead else None
        feeder = Feeder({"spatial": "f1"}, queues, batch_size=4, epochs=2, aside=aside)
        got = {}
        reader = threading.Thread(target=lambda: got.__setitem__("s0", _drain(queues["spatial"][0])))
        reader.start()
        feeder.run(batches)
        reader.join(60)
        shutdown_queues(queues)
        assert feeder.error is None
        return got["s0"], (feeder.set_aside(AHEAD), feeder.set_aside(AFTER), feeder.aside_seconds(AFTER)) if ahead else None

    dealt, (ahead, after, after_s) = run(ahead=4, after=5)
    assert dealt == run(ahead=0, after=0)[0]
    assert ahead["f2"].tolist() == [-1, -2, -3, -4] and ahead["label"].tolist() == [-1, -2, -3, -4]
    assert after["f2"].tolist() == [1000, 1001, 1002, 1003, 1004]
    assert after_s > 0   # the rows after the last epoch came in two batches: from the first to the last


def test_rows_after_the_last_epoch_are_not_handed_out_when_training_stopped_early(ray_session):
    """Training met its target: the pipeline did not run out, the windows after the last epoch may
    be missing, so the driver gets None (and decodes them on their own) rather than a part."""
    from workloads.video.feeder import AFTER, Feeder
    from workloads.video.queues import make_queues, shutdown_queues

    queues = make_queues({"spatial": 1}, depth=4)
    feeder = Feeder({"spatial": "f1"}, queues, batch_size=4, epochs=2, aside={AFTER: ["f1"]})

    def batches():
        for i, b in enumerate(_batches(epochs=2, rows=10, size=3)):
            if i == 2:
                feeder.finish.set()
            yield b
        yield {"epoch": np.array([AFTER]), "label": np.array([0]), "f1": np.array([7]), "f2": np.array([7])}

    feeder.run(batches())
    shutdown_queues(queues)
    assert feeder.error is None and feeder.set_aside(AFTER) is None


def test_set_aside_raises_the_pipelines_error_rather_than_returning_a_part(ray_session):
    import pytest

    from workloads.video.feeder import AHEAD, Feeder
    from workloads.video.queues import make_queues, shutdown_queues

    def batches():
        yield {"epoch": np.array([AHEAD]), "label": np.array([0]), "f1": np.array([1])}
        raise OSError("decode stage lost")

    queues = make_queues({"spatial": 1}, depth=2)
    feeder = Feeder({"spatial": "f1"}, queues, batch_size=4, epochs=1, aside={AHEAD: ["f1"]})
    feeder.run(batches())
    shutdown_queues(queues)
    with pytest.raises(RuntimeError, match="before the rows set aside passed: decode stage lost"):
        feeder.set_aside()


def test_finish_sends_every_worker_a_stop_mark_and_stops_pulling(ray_session):
    from workloads.video.feeder import STOP, Feeder
    from workloads.video.queues import make_queues, shutdown_queues

    queues = make_queues({"spatial": 1, "temporal": 2}, depth=4)
    feeder = Feeder({"spatial": "f1", "temporal": "f2"}, queues, batch_size=4, epochs=2)
    pulled = []

    def batches():
        for b in _batches(epochs=2, rows=10, size=3):
            pulled.append(len(b["label"]))
            if len(pulled) == 2:
                feeder.finish.set()        # the driver saw the target met
            yield b

    feeder.run(batches())
    marks = [[q.get(timeout=30) for _ in range(q.qsize())] for qs in queues.values() for q in qs]
    shutdown_queues(queues)
    assert feeder.error is None and len(pulled) == 2                  # nothing pulled after finish
    assert all(m[-1] == (STOP, 0) for m in marks)


@pytest.mark.slow
def test_a_full_queue_pauses_decoding_at_the_master_until_the_trainers_take_again(ray_session):
    import threading
    import time

    import ray

    from workloads.video.feeder import Feeder
    from workloads.video.master import start_master
    from workloads.video.queues import make_queues, shutdown_queues

    master = start_master([0, 1], [10, 10], 0)
    queues = make_queues({"spatial": 1, "temporal": 1}, depth=1)
    feeder = Feeder({"spatial": "f1", "temporal": "f2"}, queues, batch_size=4, epochs=2, master=master)
    feeding = threading.Thread(target=feeder.run, args=(_batches(epochs=2, rows=10, size=3),))
    feeding.start()
    # nobody reads yet: the queues fill, and after a second of a full queue decoding is paused
    deadline = time.time() + 60
    while ray.get(master.state.remote()) != "paused" and time.time() < deadline:
        time.sleep(0.1)
    assert ray.get(master.state.remote()) == "paused" and feeder.pauses >= 1
    got = {}
    readers = [threading.Thread(target=lambda k=k, q=q: got.__setitem__(k, _drain(q)))
               for k, q in (("s0", queues["spatial"][0]), ("t0", queues["temporal"][0]))]
    for r in readers:      # the trainers take again: decoding resumes
        r.start()
    for r in readers:
        r.join(60)
    feeding.join(60)
    shutdown_queues(queues)
    assert feeder.error is None and ray.get(master.state.remote()) == "running"
    assert feeder.paused_s > 0
    # a pause changes when a batch is decoded, never which
    assert [x for x, _ in got["s0"][:3]] == [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]
    ray.kill(master)


@pytest.mark.slow
def test_a_requested_resize_ends_the_streams_runs_after_an_epoch_and_deals_on_to_the_new_queues(ray_session):
    """Worker shifting (video.shift_apply): the resized stream's old workers get a resize mark
    right after the last epoch they train; once the driver hands over new queues (one per new
    worker), the next epoch's same global batches are split over them; the other stream is untouched."""
    import threading

    from workloads.video.feeder import END, RESIZE, Feeder
    from workloads.video.queues import make_queues, shutdown_queues

    queues = make_queues({"spatial": 1, "temporal": 2}, depth=16)
    feeder = Feeder({"spatial": "f1", "temporal": "f2"}, queues, batch_size=4, epochs=3)
    assert feeder.request_resize({"temporal": 1}) == 1          # nothing dealt yet: from epoch 1 on
    assert feeder.request_resize({"spatial": 2}) is None       # one shift at a time
    new = make_queues({"temporal": 1}, depth=16)
    old_marks = []

    def driver():  # as train.py's epoch loop: the old run ends at its mark, then the relaunched one's queues
        for q in queues["temporal"]:
            while True:
                item = q.get(timeout=60)
                if isinstance(item, tuple) and item[0] == RESIZE:
                    old_marks.append(item)
                    break
        feeder.hand_over(new)

    relaunch = threading.Thread(target=driver)
    relaunch.start()
    feeder.run(_batches(epochs=3, rows=10, size=3))
    relaunch.join(60)
    spatial = [queues["spatial"][0].get(timeout=30) for _ in range(queues["spatial"][0].qsize())]
    temporal = [new["temporal"][0].get(timeout=30) for _ in range(new["temporal"][0].qsize())]
    shutdown_queues({**queues, **new})
    assert feeder.error is None and feeder.resize_wait_s >= 0
    assert old_marks == [(RESIZE, 1), (RESIZE, 1)]              # both old temporal workers, after epoch 0
    # the relaunched single worker gets epochs 1 and 2 whole: the same global batches, unsplit
    assert [x.tolist() for x in (t["x"] for t in temporal if not isinstance(t, tuple))][:3] == \
        [[1000, 1100, 1200, 1300], [1400, 1500, 1600, 1700], [1800, 1900]]
    assert [t for t in temporal if isinstance(t, tuple)] == [(END, 1), (END, 2)]
    # spatial never noticed: three epochs, three end marks, no resize mark
    assert [t for t in spatial if isinstance(t, tuple)] == [(END, 0), (END, 1), (END, 2)]


class _Listed:
    """A queue's ``get`` over a fixed list (what a worker reads, in order)."""

    def __init__(self, items):
        self.items = list(items)

    def get(self, block=True):
        return self.items.pop(0)


def test_a_restarted_worker_whose_queues_are_an_epoch_apart_goes_on_to_the_latest_mark():
    """A group restarted while one of its queues had passed an end-of-epoch mark and another had
    not (a worker lost between reading its mark and handing the epoch over): the pass closes the
    later epoch, the queue behind reads (and drops) its batches up to that mark, and both queues
    then begin the same epoch."""
    from workloads.video.feeder import END, STOP
    from workloads.video.stream_worker import _close_epoch, _drain_to_end

    ahead = _Listed([(END, 7), "a8"])                       # its epoch 6 ended before the loss
    behind = _Listed([(END, 6), "b7", "b7'", (END, 7), "b8"])
    mine = [ahead, behind]
    ended = _drain_to_end(mine)
    assert ended == {0: 7, 1: 6}
    assert _close_epoch(mine, ended, world_size=1) == 7
    assert ahead.get() == "a8" and behind.get() == "b8"
    # queues in step: nothing is read past the marks
    even = [_Listed([(END, 3), "x"]), _Listed([(END, 3), "y"])]
    assert _close_epoch(even, _drain_to_end(even), world_size=1) == 3
    assert [q.get() for q in even] == ["x", "y"]
    # a stop mark met while catching up ends the run's pass (None)
    stopped = [_Listed([(END, 5)]), _Listed([(END, 4), (STOP, 5)])]
    assert _close_epoch(stopped, _drain_to_end(stopped), world_size=1) is None


@pytest.mark.slow
def test_a_worker_reads_its_queue_one_batch_ahead_no_more(ray_session):
    """The trainer's read-ahead (stream_worker.ReadAhead): batches in order, exactly one taken from
    the queue actor beyond what the loop has read, nothing read after a stop mark or after it is
    closed, and a queue shut down raises at the loop's get (the run was interrupted), at every get."""
    import time

    import pytest
    from ray.exceptions import RayActorError

    from workloads.video.feeder import STOP
    from workloads.video.queues import make_queues
    from workloads.video.stream_worker import ReadAhead

    def one_queue():   # a queue of a hub of its own, as a run's are, started (a run's hub is up
        q = make_queues({"q": 1}, 0)["q"][0]   # long before a trainer reads: a busy machine may
        assert q.qsize() == 0                  # take longer to start it than close() waits)
        return q

    def settles(q, size):
        deadline = time.monotonic() + 30
        while q.qsize() != size and time.monotonic() < deadline:
            time.sleep(0.05)
        return q.qsize()

    q = one_queue()
    for item in ["b0", "b1", "b2", (STOP, 3), "after the stop"]:
        q.put(item)
    ahead = ReadAhead(q)
    assert settles(q, 4) == 4                          # one batch ahead, not the queue's five
    assert ahead.get() == "b0"
    assert settles(q, 3) == 3
    assert [ahead.get(), ahead.get(), ahead.get()] == ["b1", "b2", (STOP, 3)]
    time.sleep(0.3)
    assert q.qsize() == 1                              # what follows a stop mark is not this worker's
    # closed (the worker is done) while waiting on an empty queue: nothing left waiting on it
    empty = one_queue()
    idle = ReadAhead(empty)
    time.sleep(0.3)
    idle.close()
    assert not idle._thread.is_alive()
    empty.put("for whoever reads next")
    time.sleep(2 * ReadAhead.POLL_S)
    assert empty.qsize() == 1
    gone = one_queue()
    ahead = ReadAhead(gone)
    gone.shutdown(force=True)
    for _ in range(2):
        with pytest.raises(RayActorError):
            ahead.get()


def test_one_actor_holds_every_queue_of_a_run_and_ends_with_the_last(ray_session):
    """queues.py: a stream's queues and the results queue are one actor (Ray's queue is a process
    each), bounded per queue (Full after the timeout, Empty when there is nothing), each queue its
    own order; dropping some keeps the others; a call on a dropped queue, waiting or late, raises
    RayActorError (how a trainer learns the run stopped), and the hub ends with its last queue."""
    import threading

    import pytest
    from ray.exceptions import RayActorError
    from ray.util.queue import Empty, Full

    from workloads.video.queues import make_queues, shutdown_queues

    queues = make_queues({"spatial": 1, "temporal": 2}, depth=2)
    results = make_queues({"results": 1}, 0, hub=queues["spatial"][0].hub)["results"][0]
    hubs = {q.hub for qs in queues.values() for q in qs} | {results.hub}
    assert len(hubs) == 1
    t0, t1 = queues["temporal"]
    t0.put("a"), t0.put("b"), t1.put("c")
    with pytest.raises(Full):
        t0.put("c", timeout=0.2)                      # two batches deep
    with pytest.raises(Full):
        t0.put("c", block=False)
    for i in range(5):
        results.put(i)                                # unbounded
    assert [t0.get(), t1.get(), t0.get()] == ["a", "c", "b"] and results.qsize() == 5
    with pytest.raises(Empty):
        t0.get(timeout=0.2)
    with pytest.raises(Empty):
        t1.get(block=False)
    raised = []
    waiting_on_t1 = threading.Thread(target=lambda: raised.append(_get_error(t1)))
    waiting_on_t1.start()
    shutdown_queues({"temporal": queues["temporal"]})   # a shifted stream's queues: the rest go on
    waiting_on_t1.join(30)
    assert raised and isinstance(raised[0], RayActorError)   # woken by the drop, or arrived after it
    for late in (lambda: t0.get(block=False), lambda: t1.put("x"), t0.qsize):
        with pytest.raises(RayActorError, match="was shut down"):   # a call after the drop
            late()
    results.put("after")
    assert [results.get() for _ in range(6)] == [0, 1, 2, 3, 4, "after"]
    raised.clear()
    waiting = threading.Thread(target=lambda: raised.append(_get_error(queues["spatial"][0])))
    waiting.start()
    shutdown_queues({"spatial": queues["spatial"], "results": [results]})
    waiting.join(30)
    assert raised and isinstance(raised[0], RayActorError)


def _get_error(queue):
    try:
        queue.get(block=True)
    except Exception as err:  # noqa: BLE001 - what the waiting get raised is the test's subject
        return err
    return None
