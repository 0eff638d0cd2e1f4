"""video's trained model (both streams, the fusion, the preprocessing) as an MLflow pyfunc Model,
loaded in a fresh process, and ``mode=predict`` through the CLI on real MP4 files with a
ground-truth segments CSV, one file not a video; highlight metrics during training."""
from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest

from tests.orchard.model_helpers import predict_cli, pyfunc_in_fresh_process


@pytest.fixture(scope="module")
def trained(cli_run):
    run = cli_run("workload=video")
    assert run.exit_code == 0, run.console[-3000:]
    return run


def test_temporal_iou_and_average_precision():
    from workloads.video.evaluate import average_precision, highlight_metrics, temporal_iou
    from workloads.video.evaluate import merge_windows

    assert temporal_iou((0, 10), (5, 15)) == pytest.approx(5 / 15)
    assert merge_windows([0, 4, 12], 8, 30, [0.5, 0.7, 0.9]) == [(0, 20, pytest.approx(0.7))]
    truth = {"a": [(10, 20)], "b": [(0, 10)]}
    assert average_precision([("a", 10, 20, 0.9), ("b", 50, 60, 0.8), ("b", 0, 9, 0.1)], truth) == pytest.approx(
        0.5 * 1.0 + 0.5 * (2 / 3))
    got = highlight_metrics({"a": {"label": "x", "frames": 30, "segments": [(10, 20, 0.9)]}},
                            {"a": [(10, 20, "x")]}, "predict")
    assert got["predict/temporal_iou"] == 1.0 and got["predict/map_tiou_0.5"] == 1.0


@pytest.mark.slow
def test_training_reports_highlight_quality_on_the_untrimmed_set(trained):
    m = trained.run.data.metrics
    assert 0 <= m["infer/temporal_iou"] <= 1 and 0 <= m["infer/map_tiou_0.5"] <= 1
    assert m["infer/videos_with_truth"] == 2


@pytest.mark.slow
def test_the_logged_model_classifies_decoded_frames_in_a_fresh_process(trained, tmp_path):
    from workloads.video.decoder import build_decoder

    video = sorted((trained.run_dir / "untrimmed").glob("*.mp4"))[0]
    frames = build_decoder("pyav").decode_all(str(video))          # the file's own size, every frame
    got = pyfunc_in_fresh_process(trained.uri, f"runs:/{trained.run_id}/model", frames[None, 8:20], tmp_path)
    assert not got.ray_loaded
    assert got.metadata["orchard_workload"] == "video"
    classes = got.metadata["classes"].split(",")
    assert got.on_example.shape == (1, len(classes)) and got.on_file.shape == (1, len(classes))
    np.testing.assert_allclose(got.on_file.sum(1), 1.0, atol=1e-3)


@pytest.mark.slow
def test_predict_classifies_videos_finds_highlights_and_skips_a_broken_file(trained, tmp_path):
    folder = tmp_path / "videos"
    folder.mkdir()
    for video in sorted((trained.run_dir / "untrimmed").glob("*.mp4")):
        shutil.copy(video, folder)
    (folder / "broken.mp4").write_text("not a video")
    with open(folder / "segments.csv", "w") as f:   # the smoke set: 8 still frames, 8 action frames, 8 still
        f.write("video,start_frame,end_frame,label\nuntrimmed_0.mp4,8,16,\nuntrimmed_1.mp4,8,16,\n")
    result = predict_cli(trained, "video", f"runs:/{trained.run_id}/model", folder, tmp_path)
    assert result.exit_code == 0, result.console[-3000:]
    assert "Traceback" not in result.console and "skipped broken.mp4" in result.console
    with open(result.predictions / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    classes = trained.run.data.params["video.classes"].split(",")
    assert [r["file"] for r in rows] == ["untrimmed_0.mp4", "untrimmed_1.mp4"]
    for r in rows:
        assert r["label"] in classes and 0 < float(r["confidence"]) <= 1 and r["frames"] == "24"
        segments = json.loads(r["segments"])
        assert segments and all(0 <= s < e <= 24 for s, e, _ in segments)
    m = result.metrics
    assert m["predict/videos"] == 2 and m["predict/skipped"] == 1 and m["predict/videos_per_s"] > 0
    assert m["data/skipped_files"] == 1 and sum(v for k, v in m.items() if k.startswith("data/skipped_files/")) == 1
    assert 0 < m["predict/temporal_iou"] <= 1 and 0 <= m["predict/map_tiou_0.5"] <= 1


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
    """mode=predict over a long video: decoded frames are held a window batch at a time
    (``video.inference.max_frames_in_memory``), never the whole video, and the verdict is the one
    the whole video in memory gives. A real H.264 file 10x longer than the bound; a model with the
    trained model's anatomy (both streams, fusion, highlight settings) and seeded weights."""
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
