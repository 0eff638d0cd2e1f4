"""orchard/tracking/time_split.py: a run's seconds in consecutive parts that always add up to its wall time."""
from __future__ import annotations

import time

from orchard.tracking import time_split
from orchard.tracking.time_split import TimeSplit


def test_marks_cut_the_wall_clock_into_parts_that_add_up():
    split = TimeSplit()
    time.sleep(0.02)
    split.mark("data")
    time.sleep(0.01)
    split.mark("training")
    split.mark("data")  # a part met twice adds up
    assert set(split.parts) == {"data", "training"}
    assert split.parts["data"] >= 0.02 and split.parts["training"] >= 0.01
    assert abs(sum(split.parts.values()) - split.total()) < 1e-9
    assert split.metrics() == {"time/split/data_s": split.parts["data"], "time/split/training_s": split.parts["training"]}
    # its start on the wall clock, where another process's clock meets it (the run's orchard.started_at)
    before = time.time()
    assert before - 1.0 < TimeSplit().started_at <= time.time()
    assert abs(split.started_at + split.total() - time.time()) < 0.5


def test_carving_moves_seconds_out_of_a_part_and_never_more_than_it_holds():
    split = TimeSplit(started=0.0)
    split.parts, split._last = {"training": 10.0}, 10.0
    split.carve("training", {"worker_group_start": 4.0, "steps": 5.0, "checkpoints": 3.0, "validation": None})
    # the checkpoints got what was left (1 s), nothing went negative, the sum is still the wall time
    assert split.parts == {"training": 0.0, "worker_group_start": 4.0, "steps": 5.0, "checkpoints": 1.0}
    assert sum(split.parts.values()) == split.total() == 10.0
    split.carve("evaluation", {"steps": 2.0})  # a part never marked gives nothing
    assert split.parts["steps"] == 5.0 and "evaluation" not in split.parts


def test_the_summary_line_lists_the_parts_in_the_order_a_run_meets_them():
    metrics = {"time/split/close_s": 0.04, "time/split/data_s": 1.25, "time/split/ray_start_s": 3.0,
               "time/split/worker_group_start_s": 6.8, "time/split/my_own_part_s": 2.0, "time/total_s": 13.1}
    assert time_split.line(metrics) == "ray 3.0, data 1.2, group start 6.8, close 0.0, my own part 2.0 s"
    assert time_split.line({"time/total_s": 1.0}) is None


def test_a_context_marks_only_where_a_split_is_kept():
    from orchard.tracking.context import RunContext

    ctx = RunContext(sink=None, run_id=None, run_dir=".", workload="tiny", strategy="local")
    ctx.mark("data")  # a bare context (a worker's copy, a test's): nothing, no error
    ctx.time_split = TimeSplit()
    ctx.mark("data")
    assert "data" in ctx.time_split.parts
    assert ctx.__getstate__()["time_split"] is None  # a worker's copy never carries the driver's split
