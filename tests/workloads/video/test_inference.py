"""workloads/video/inference.py: sliding windows over an untrimmed video, the highlight gates, its label from the highlights."""
from __future__ import annotations

import numpy as np

from workloads.video.inference import classify_untrimmed, highlight_mask, window_offsets


HIGHLIGHT = {"motion_ratio": 0.5, "confidence_ratio": 0.5, "min_motion_contrast": 0.02}


def _gate(confidence, motion, **overrides):
    opts = HIGHLIGHT | overrides
    return highlight_mask(np.array(confidence), np.array(motion), opts["motion_ratio"],
                          opts["confidence_ratio"], opts["min_motion_contrast"]).tolist()


def test_sliding_windows_cover_the_whole_video():
    assert window_offsets(20, 8, 4) == [0, 4, 8, 12]
    assert window_offsets(21, 8, 4) == [0, 4, 8, 12, 13]
    assert window_offsets(5, 8, 4) == [0]


def test_highlight_motion_gate_is_relative_to_the_videos_own_background():
    # a slow rotation recorded in a real run: background 0.11 px/frame, action 0.14-0.17;
    # the old absolute 0.25 px/frame floor dropped every action window
    motion = [0.11, 0.11, 0.11, 0.15, 0.16, 0.17, 0.16, 0.11, 0.11]
    conf = [0.55, 0.55, 0.55, 0.40, 0.45, 0.50, 0.49, 0.54, 0.54]
    assert _gate(conf, motion) == [False] * 3 + [True] * 4 + [False] * 2
    # the same shape at 10x the motion (a fast translation) selects the same windows
    assert _gate(conf, [10 * m for m in motion]) == [False] * 3 + [True] * 4 + [False] * 2


def test_highlight_confidence_gate_and_no_background_cases():
    # motion passes windows 1-3; window 2 is far less confident than the best of them
    assert _gate([0.9, 0.8, 0.3, 0.7], [0.0, 1.0, 1.0, 1.0]) == [False, True, False, True]
    # a video that moves throughout (no static background): the motion gate keeps all
    assert _gate([0.6, 0.6, 0.6], [1.00, 1.01, 1.005]) == [True, True, True]
    # no motion cue at all (a stream pair without a temporal feature): confidence alone
    assert _gate([0.2, 0.9], [np.inf, np.inf]) == [False, True]
    # never empty: the most moving window always survives both gates
    assert any(_gate([0.1, 0.1], [0.0, 0.5], confidence_ratio=1.0))


def test_untrimmed_label_comes_from_the_highlights_not_the_background():
    # 12 windows: 10 background windows lean to class 1, with more confidence than the
    # action and only quantisation-noise motion; 2 action windows say class 2
    bg, act = [0.2, 0.7, 0.1], [0.1, 0.35, 0.55]
    rows = np.array([bg] * 10 + [act] * 2)
    window_scores = {"spatial": rows, "temporal": rows}
    motion = np.array([0.11] * 10 + [0.16] * 2)
    out = classify_untrimmed(window_scores, motion, "avg", {}, HIGHLIGHT, topk=2)
    assert out["keep"].tolist() == [False] * 10 + [True] * 2
    assert out["label"] == 2
    assert out["label_all_windows"] == 1         # without highlight detection the background wins
