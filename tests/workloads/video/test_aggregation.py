"""workloads/video/aggregation.py: each fusion method on hand-made scores, the winner and its tie-break."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.video import aggregation


def _one_video(spatial, temporal):
    return {"spatial": np.array([spatial], float), "temporal": np.array([temporal], float)}


def test_avg_max_and_topk_pooling_on_hand_made_scores():
    # one video, 3 segments, 3 classes; two streams
    spatial = [[0.6, 0.3, 0.1], [0.6, 0.3, 0.1], [0.0, 0.1, 0.9]]
    temporal = [[0.5, 0.4, 0.1], [0.5, 0.4, 0.1], [0.0, 0.2, 0.8]]
    s = _one_video(spatial, temporal)
    stacked = aggregation._stack(s)
    assert np.allclose(aggregation.pool_avg(stacked)[0], [(0.4 + 1 / 3) / 2, (0.7 / 3 + 1 / 3) / 2, (1.1 / 3 + 1 / 3) / 2])
    # avg says class 0, max says class 2 (one confident segment), top-2 says class 0
    assert aggregation.fuse("avg", s, {}).argmax() == 0
    assert aggregation.fuse("max", s, {}).argmax() == 2
    assert np.allclose(aggregation.pool_max(stacked)[0], [0.55, 0.35, 0.85])
    assert np.allclose(aggregation.pool_topk(stacked, k=2)[0], [0.55, 0.35, (0.9 + 0.1 + 0.8 + 0.1) / 4])
    assert np.allclose(aggregation.pool_topk(stacked, k=99), aggregation.pool_avg(stacked))


def _informative_and_noise_streams(n=40, c=4, seed=0):
    """The temporal stream knows the label, the spatial one is noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % c
    temporal = rng.dirichlet(np.ones(c), size=(n, 3)) * 0.5
    temporal[np.arange(n), :, labels] += 0.5
    spatial = rng.dirichlet(np.ones(c) * 0.3, size=(n, 3))
    return {"spatial": spatial, "temporal": temporal}, labels


def test_linear_weighting_learns_to_trust_the_informative_stream():
    scores, labels = _informative_and_noise_streams()
    w = aggregation.fit_linear(aggregation._stack(scores), labels)
    assert w.sum() == pytest.approx(1.0)
    assert w[1] > w[0]                       # sorted streams: spatial, temporal
    fused = aggregation.fuse("linear", scores, {"linear_weights": {"spatial": w[0], "temporal": w[1]}})
    assert aggregation.topk_accuracy(fused, labels, 1) == 1.0


def test_attention_weighting_beats_averaging_a_noise_stream():
    scores, labels = _informative_and_noise_streams(seed=1)
    stacked = aggregation._stack(scores)
    pool = aggregation.AttentionPool(steps=120, seed=0).fit(stacked, labels)
    acc_attention = aggregation.topk_accuracy(pool.predict(stacked), labels, 1)
    acc_avg = aggregation.topk_accuracy(aggregation.pool_avg(stacked), labels, 1)
    assert acc_attention == 1.0 and acc_attention >= acc_avg


def test_evaluate_reports_every_method_tags_a_winner_and_topk_accuracy():
    scores, labels = _informative_and_noise_streams(n=48, c=6)
    out = aggregation.evaluate(scores, labels, topk=2, n_folds=2, attention_steps=40)
    methods = [r["method"] for r in out["table"]]
    assert methods[:5] == list(aggregation.METHODS)
    assert {"spatial_only", "temporal_only"} <= set(methods)
    assert out["winner"] in aggregation.METHODS
    best = max(r["top1"] for r in out["table"][:5])
    assert next(r for r in out["table"] if r["method"] == out["winner"])["top1"] == best
    assert all("top5" in r for r in out["table"])               # 6 classes: top-5 is meaningful
    assert aggregation.topk_accuracy(np.eye(3), np.array([0, 1, 2]), 1) == 1.0
    assert aggregation.topk_accuracy(np.array([[0.5, 0.3, 0.2]]), np.array([2]), 2) == 0.0


def test_winner_tie_break_is_top1_then_top5_then_log_loss_then_method_order():
    row = lambda m, t1, t5, ll: {"method": m, "top1": t1, "top5": t5, "log_loss": ll}  # noqa: E731
    # every method at top-1 1.00 (the idle run's tie): the most confident fusion wins
    table = [row("avg", 1.0, 1.0, 0.40), row("max", 1.0, 1.0, 0.50), row("topk", 1.0, 1.0, 0.45),
             row("linear", 1.0, 1.0, 0.10), row("attention", 1.0, 1.0, 0.30),
             row("temporal_only", 1.0, 1.0, 0.01)]          # reference rows never win
    assert aggregation.pick_winner(table) == "linear"
    # top-5 breaks a top-1 tie before log-loss does
    table[1] = row("max", 1.0, 1.0 + 1e-9, 0.90)
    assert aggregation.pick_winner(table) == "max"
    # an exact tie on everything goes to the earlier, simpler method
    assert aggregation.pick_winner([row(m, 0.5, 0.9, 0.3) for m in ("attention", "topk", "avg")]) == "avg"
    # log_loss renormalises max/top-k scores: only the label's share counts
    assert aggregation.log_loss(np.array([[2.0, 2.0]]), np.array([0])) == pytest.approx(np.log(2))
