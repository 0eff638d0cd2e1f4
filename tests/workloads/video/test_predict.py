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
