"""workloads/video/train.py: the driver's side of the two streams' training."""
from __future__ import annotations

from workloads.video.train import shift_workers


def test_worker_shifting_rule_moves_one_worker_to_the_lagging_stream():
    alloc, why = shift_workers({"spatial": 2, "temporal": 1}, {"spatial": 0.5, "temporal": 1.0}, 1.2, 1)
    assert alloc == {"spatial": 1, "temporal": 2} and "temporal lags" in why
    same, _ = shift_workers({"spatial": 2, "temporal": 1}, {"spatial": 0.9, "temporal": 1.0}, 1.2, 1)
    assert same == {"spatial": 2, "temporal": 1}
    floor, why = shift_workers({"spatial": 1, "temporal": 1}, {"spatial": 0.5, "temporal": 1.0}, 1.2, 1)
    assert floor == {"spatial": 1, "temporal": 1} and "minimum" in why
