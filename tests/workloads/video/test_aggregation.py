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


# ----------------------------------------------------------------------- fusion that learns (issue 51)
def _one_stream_at_chance(videos_per_class: int, classes: int, seed: int = 0, flat: bool = False):
    """The spatial stream knows the label (noisy logits, top-1 below 1), the temporal one is at
    chance: confident random scores (``flat=False``, what an untrained CNN on noise gives) or
    near-uniform ones. Segments of one video share its noise, as a CNN's do."""
    rng = np.random.default_rng(seed)
    n, k = videos_per_class * classes, 3
    labels = np.repeat(np.arange(classes), videos_per_class)
    softmax = lambda z: np.exp(z) / np.exp(z).sum(-1, keepdims=True)  # noqa: E731
    logits = 1.2 * rng.normal(size=(n, 1, classes)) + 0.3 * rng.normal(size=(n, k, classes))
    logits[np.arange(n), :, labels] += 2.5
    chance = (0.1 if flat else 3.0) * rng.normal(size=(n, k, classes))
    return {"spatial": softmax(logits), "temporal": softmax(chance)}, labels


def _row(out: dict, method: str) -> dict:
    return next(r for r in out["table"] if r["method"] == method)


@pytest.mark.parametrize("videos_per_class,classes,flat", [
    (1, 12, False),   # one validation video per class: the real-footage case (3 clips x 4 copies)
    (1, 12, True),
    (6, 4, False),
    (6, 4, True),
])
def test_a_stream_at_chance_gets_little_weight_and_the_fitted_fusions_match_the_informative_stream(
        videos_per_class, classes, flat):
    scores, labels = _one_stream_at_chance(videos_per_class, classes, seed=videos_per_class, flat=flat)
    out = aggregation.evaluate(scores, labels, topk=2, n_folds=4, attention_steps=150)
    informative = _row(out, "spatial_only")["top1"]
    assert informative < 1.0 and (flat or _row(out, "avg")["top1"] < informative)  # averaging in noise costs
    for method in ("linear", "attention"):
        row = _row(out, method)
        assert row["top1"] >= informative, (method, row, informative)   # the reported row never below it
        # and the fit itself (held out, before any fallback) is close to the informative stream
        assert row["fitted_top1"] >= informative - 1.5 / len(labels), (method, row, informative)
    assert out["learned"]["linear_weights"]["temporal"] <= 0.1
    assert out["learned"]["attention_stream_weights"]["temporal"] <= 0.1


def test_complementary_streams_are_fused_better_than_either_alone():
    """Each stream knows half the classes and is unsure on the rest: a fitted fusion beats both."""
    rng = np.random.default_rng(3)
    c, n, k = 6, 48, 3
    labels = np.arange(n) % c
    spatial = rng.dirichlet(np.ones(c) * 2, size=(n, k))
    temporal = rng.dirichlet(np.ones(c) * 2, size=(n, k))
    knows = labels < c // 2
    spatial[knows] = 0.3 * spatial[knows] + 0.7 * np.eye(c)[labels[knows]][:, None]
    temporal[~knows] = 0.3 * temporal[~knows] + 0.7 * np.eye(c)[labels[~knows]][:, None]
    out = aggregation.evaluate({"spatial": spatial, "temporal": temporal}, labels, topk=2, n_folds=4,
                               attention_steps=150)
    best_single = max(_row(out, "spatial_only")["top1"], _row(out, "temporal_only")["top1"])
    for method in ("linear", "attention"):
        row = _row(out, method)
        assert row["fallback"] is None and row["fitted_top1"] >= best_single + 0.2, row
    assert 0.3 <= out["fitted"]["linear_weights"]["spatial"] <= 0.7


class _Ctx:
    """What evaluate.fusion logs to: artifacts and tags, kept in memory."""

    def __init__(self):
        self.dicts, self.texts, self.tags = {}, {}, {}

    def log_dict(self, d, path):
        self.dicts[path] = d

    def log_text(self, t, path):
        self.texts[path] = t

    def set_tags(self, tags):
        self.tags |= tags


def test_a_fit_worse_than_a_single_stream_falls_back_to_it_with_a_tag(monkeypatch):
    from workloads.video.evaluate import fusion

    scores, labels = _one_stream_at_chance(4, 5, seed=7)
    # forced: a linear fit that never moves from equal weights, an attention module never trained
    monkeypatch.setattr(aggregation, "fit_linear", lambda s, y, **_: np.full(s.shape[0], 1 / s.shape[0]))
    vcfg = {"aggregation": {"topk": 2, "folds": 4, "attention_steps": 0}}
    ctx = _Ctx()
    agg, metrics = fusion(scores, labels, vcfg, 0, ctx)
    spatial_only = scores["spatial"].mean(1)
    for method in ("linear", "attention"):
        row = _row(agg, method)
        assert row["fallback"] == "spatial_only" and row["fitted_top1"] < row["top1"]
        assert ctx.tags[f"video.agg_{method}_fallback"] == "spatial_only"
        assert metrics[f"val/agg_{method}_top1"] == metrics["val/agg_spatial_only_top1"]
        # the fallback is the method's own parameters (what the logged model and inference use)
        np.testing.assert_allclose(aggregation.fuse(method, scores, agg["fitted"]), spatial_only, atol=1e-6)
    table = ctx.dicts["tables/aggregation.json"]
    assert table["fallbacks"] == {"linear": "spatial_only", "attention": "spatial_only"}
    assert table["linear_weights"] == {"spatial": 1.0, "temporal": 0.0}
    assert "fell back to spatial_only" in ctx.texts["tables/aggregation.md"]
