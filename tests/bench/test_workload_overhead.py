"""bench/workload_overhead.py: both sides' first and last step are read from their own time split
the same way, and both sides really run the workload: orchard's CLI and the same run() wired by
hand (bench/hand_wired.py) finish the forest's smoke run with the same work in their splits.
Timings are never asserted."""
from __future__ import annotations

import pytest

from tests.session_ray import attach_overrides


def test_the_step_window_is_what_comes_before_the_work_and_the_work():
    from bench.workload_overhead import step_window

    parts = {"ray_start": 2.0, "store_open": 1.0, "data": 3.0, "training": 0.5, "worker_group_start": 4.0,
             "first_step": 1.5, "steps": 6.0, "checkpoints": 0.5, "validation": 1.0, "evaluation": 2.0, "close": 1.0}
    # flower: the Train group's start and the way to the first step come before; its loop is the work
    assert step_window("flower", 100.0, parts) == (111.5, 119.0)
    # the others: training (and the validation video interleaves with it) is the work
    video = {"ray_start": 2.0, "store_open": 1.0, "data": 3.0, "training": 7.0, "validation": 2.0, "evaluation": 1.0}
    assert step_window("video", 100.0, video) == (106.0, 115.0)
    forest = {"ray_start": 2.0, "data": 3.0, "training": 7.0, "checkpoints": 0.2, "evaluation": 1.0}
    assert step_window("forest", 100.0, forest) == (105.0, 112.0)  # its last checkpoint comes after


@pytest.mark.slow
def test_orchard_and_the_hand_wired_run_finish_the_same_forest_run(ray_session, tmp_path):
    from bench import workload_overhead as wo

    extra = tuple(attach_overrides())
    ours = wo.orchard_side("forest", tmp_path, extra)
    peer = wo.peer_side("forest", tmp_path, wo.peer_config("forest", tmp_path, extra))
    for side in (ours, peer):
        assert side["status"] == "FINISHED"
        assert 0 < side["to_first_step_s"] and 0 < side["work_s"] and 0 < side["after_last_step_s"]
        assert side["to_first_step_s"] + side["work_s"] + side["after_last_step_s"] == pytest.approx(side["wall_s"])
    # the same data and seed: the same forest, so the same held-out figure
    assert ours["headline"] and ours["headline"] == peer["headline"]
