"""bench/video_shift.py's row: each side timed to its target (or its whole training when it never
met it), the sides alternating within a repeat, each side's shifts and target count beside it.
The shifting itself is tested on a real run in tests/workloads/video/test_train.py."""
from __future__ import annotations


def test_each_side_is_timed_to_its_target_and_shows_its_shifts(monkeypatch):
    from bench import video_shift as vs

    order = []

    def one_run(overrides, shift, tmp, i):
        order.append(shift)
        m = {"train/epochs_run": 4, "pipeline/shifts_applied": 2 if shift else 0, "pipeline/shift_wait_s": 1.5,
             "val/agg_avg_top1": 0.5, "val/agg_linear_top1": 0.75}
        return {**m, "time/to_target_s": 30.0 + i} if shift else {**m, "time/train_s": 50.0}  # the peer never met it

    monkeypatch.setattr(vs, "one_run", one_run)
    (r,) = vs.measure(vs.SIZES["smoke"], 2)
    assert order == [True, False, True, False]
    assert r["orchard"]["values"] == [30.0, 31.0] and r["peer"]["values"] == [50.0, 50.0]
    assert r["quality"]["orchard"] == {"met target": "2/2", "fused top-1": 0.75, "epochs": 4, "shifts applied": 2,
                                       "relaunch wait s": 1.5}
    assert r["quality"]["peer"]["met target"] == "0/2" and r["quality"]["peer"]["shifts applied"] == 0
    assert r["note"] == " ".join(vs.SIZES["smoke"]["overrides"])
