"""video mode=predict over a long video: decoded frames are held a window batch at a time
(``video.inference.max_frames_in_memory``), never the whole video, and the verdict is the one the
whole video in memory gives. A real H.264 file 10x longer than the bound; a model with the
trained model's anatomy (both streams, fusion, highlight settings) and seeded weights."""
from __future__ import annotations

import numpy as np
import pytest

MAX_FRAMES = 16


def _write_long_video(path, n: int, size: int = 32) -> None:
    """A real H.264 file: a still background, then a square that moves, then still again."""
    import av

    out = av.open(str(path), "w")
    stream = out.add_stream("libx264", rate=25)
    stream.width = stream.height = size
    stream.pix_fmt = "yuv420p"
    for i in range(n):
        img = np.full((size, size, 3), 60, np.uint8)
        x = (3 * i) % (size - 8) if n // 3 <= i < 2 * n // 3 else 4
        img[10:18, x:x + 8] = (220, 200, 60)
        for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()


def _model():
    import torch

    from workloads.video.model import build_stream_model
    from workloads.video.predict import VideoModel
    from workloads.video.train import stream_channels

    torch.manual_seed(0)
    options = {"framediff": {}}
    streams = {"spatial": {"feature": "rgb", "in_channels": stream_channels("rgb", 4, options, 32)},
               "temporal": {"feature": "framediff", "in_channels": stream_channels("framediff", 4, options, 32)}}
    settings = {"classes": ["left", "down", "still"], "streams": streams, "widths": [4, 8], "dropout": 0.0, "size": 32,
                "stack": 4, "short_rule": "loop", "extractor_options": options, "method": "avg", "topk": 3,
                "linear_weights": {}, "attention_hidden": 16, "window_stride": 3,
                "inference": {"motion_ratio": 0.5, "min_motion_contrast": 0.02, "confidence_ratio": 0.5}}
    states = {s: build_stream_model(spec["in_channels"], 3, [4, 8], 0.0).state_dict() for s, spec in streams.items()}
    return VideoModel(settings, states, None)


def test_a_video_10x_the_bound_is_classified_in_windows_as_if_held_whole(tmp_path):
    from workloads.video.decoder import build_decoder

    path = tmp_path / "long.mp4"
    _write_long_video(path, 10 * MAX_FRAMES)
    dec = build_decoder("pyav", size=32)
    length = len(dec.index(str(path)))
    model = _model()
    whole = model.classify_video(dec.decode_all(str(path)))
    windowed = model.classify_frames(dec.iter_frames(str(path)), length, MAX_FRAMES)
    assert model.peak_frames <= MAX_FRAMES                    # never more decoded frames than the bound
    assert length == 10 * MAX_FRAMES and windowed["frames"] == length
    assert {k: windowed[k] for k in ("label", "windows", "kept")} == {k: whole[k] for k in ("label", "windows", "kept")}
    assert windowed["confidence"] == pytest.approx(whole["confidence"], abs=1e-5)
    assert [(s, e) for s, e, _ in windowed["segments"]] == [(s, e) for s, e, _ in whole["segments"]]


def test_a_video_that_ends_early_is_refused_not_half_scored():
    model = _model()
    frames = (np.zeros((32, 32, 3), np.uint8) for _ in range(40))   # 40 frames where 100 were announced
    with pytest.raises(ValueError, match="truncated: decoded 40 of 100 frames"):
        model.classify_frames(frames, 100, MAX_FRAMES)
