"""flower's trained model as an MLflow Model (PyTorch flavour), loaded in a fresh process, and
``mode=predict`` through the CLI on real PNGs, one of them not an image."""
from __future__ import annotations

import csv

import cv2
import numpy as np
import pytest
import torch

from tests.orchard.model_helpers import predict_cli, pyfunc_in_fresh_process
from workloads.flower.model import FlowerCounterCNN

from .helpers import random_tiles


@pytest.fixture(scope="module")
def trained(cli_run):
    run = cli_run("workload=flower", "strategy=ring")
    assert run.exit_code == 0, run.console[-3000:]
    return run


@pytest.fixture(scope="module")
def field_png():
    """A real field image whose size is not a multiple of the tile, and its flower count."""
    from workloads.flower.synthetic_field import render_field

    rgb, points, _ = render_field(np.random.default_rng(5), 150, 201, (0, 0, 201, 150), 64, 3.0, (2.5, 5.0), 0.2, 0.0)
    return rgb, len(points)


@pytest.mark.slow
def test_the_logged_model_predicts_in_a_fresh_process_without_ray(trained, field_png, tmp_path):
    import torch

    from workloads.flower.checkpoint import load_model

    import mlflow

    # MLflow 3.17 resolves runs:/<id>/model on the process's current store whatever tracking_uri
    # says (docs/models.md), and another test may have pointed it elsewhere: point it here
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(trained.uri)
    try:
        listed = mlflow.artifacts.list_artifacts(artifact_uri=f"runs:/{trained.run_id}/model", tracking_uri=trained.uri)
    finally:
        mlflow.set_tracking_uri(previous)
    assert "model/MLmodel" in [a.path for a in listed]   # the run's LoggedModel, named model
    rgb, _ = field_png
    tiles = np.ascontiguousarray(rgb[:64, :128].reshape(1, 64, 2, 64, 3).swapaxes(1, 2).reshape(2, 64, 64, 3))
    x = tiles.transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    got = pyfunc_in_fresh_process(trained.uri, f"runs:/{trained.run_id}/model", x, tmp_path)
    assert not got.ray_loaded
    assert "pytorch" in got.flavors and "python_function" in got.flavors
    assert got.metadata["orchard_workload"] == "flower" and got.metadata["tile_size"] == 64
    assert got.on_example.shape == (len(got.example), 1, 64, 64)
    assert got.on_file.shape == (2, 1, 64, 64)
    # the same numbers as the state dict the run saved (weights only)
    model, scale = load_model(trained.run_dir / "model.pt")
    with torch.inference_mode():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got.on_file, expected, rtol=1e-4, atol=1e-4)
    assert got.metadata["density_scale"] == pytest.approx(scale)


@pytest.mark.slow
def test_predict_counts_new_images_and_skips_a_bad_file(trained, field_png, tmp_path):
    from workloads.flower.predict import count_image
    from workloads.flower.checkpoint import load_model

    rgb, true_count = field_png
    folder = tmp_path / "new_images"
    folder.mkdir()
    cv2.imwrite(str(folder / "odd.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    (folder / "notes.png").write_text("a text file named .png")
    (folder / "gone.png").symlink_to(tmp_path / "moved_away.png")       # listed, then nothing to read
    cv2.imwrite(str(folder / "big.png"), np.zeros((200, 300, 3), np.uint8))   # over the bound below
    result = predict_cli(trained, "flower", f"runs:/{trained.run_id}/model", folder, tmp_path,
                         "flower.max_image_pixels=50000")
    assert result.exit_code == 0, result.console[-3000:]
    assert "Traceback" not in result.console
    assert "skipped notes.png: not a readable image" in result.console
    assert "skipped big.png: 300x200" in result.console and "flower.max_image_pixels=50000" in result.console
    with open(result.predictions / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["file"], r["width"], r["height"]) for r in rows] == [("odd.png", "201", "150")]
    model, scale = load_model(trained.run_dir / "model.pt")
    density = count_image(model, rgb, 64, scale)
    assert float(rows[0]["count"]) == pytest.approx(float(density.sum()), abs=1e-2)
    assert 0 <= float(rows[0]["count"]) < 10 * true_count
    assert cv2.imread(str(result.predictions / "density" / "odd.png")).shape == (150, 201, 3)
    with open(result.predictions / "skipped.csv") as f:
        assert sorted(r["file"] for r in csv.DictReader(f)) == ["big.png", "gone.png", "notes.png"]
    m = result.metrics
    assert m["predict/images"] == 1 and m["predict/skipped"] == 3 and m["predict/images_per_s"] > 0
    # counted by kind, as training counts them (orchard/tracking/skipped.py)
    assert m["data/skipped_files"] == 3 and m["data/skipped_files/missing"] == 1 and m["data/skipped_files/too_large"] == 1
    assert "skipped.csv" in result.artifacts()
    assert {"predictions/predictions.csv", "predictions/skipped.csv", "predictions/density"} <= set(result.artifacts("predictions"))


@pytest.mark.slow
def test_predict_takes_a_registered_model_and_refuses_nothing_readable(trained, field_png, tmp_path):
    from orchard.models import register

    version = register(f"runs:/{trained.run_id}/model", "flower-counter-test", trained.uri, {"test": "yes"})
    rgb, _ = field_png
    folder = tmp_path / "one"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.jpg"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    result = predict_cli(trained, "flower", version, folder / "a.jpg", tmp_path)
    assert result.exit_code == 0, result.console[-3000:]
    assert result.metrics["predict/images"] == 1
    # a folder where nothing reads: one line, exit 2, no traceback
    empty = tmp_path / "bad"
    empty.mkdir()
    (empty / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    bad = predict_cli(trained, "flower", version, empty, tmp_path / "again")
    assert bad.exit_code == 2 and "Traceback" not in bad.console
    assert "orchard: bad config: input: readable images" in bad.console


def test_prediction_actors_ask_for_a_gpu_only_where_one_is_wanted_and_there():
    from orchard import ConfigError
    from workloads.flower.predict import predict_gpus

    assert predict_gpus("auto", 0) == 0.0 and predict_gpus("cpu", 4) == 0.0
    assert predict_gpus("auto", 1) == 1.0 and predict_gpus("cuda:0", 2) == 1.0
    with pytest.raises(ConfigError, match="flower.eval_device"):
        predict_gpus("cuda", 0)


def test_a_photo_is_counted_a_band_of_tile_rows_at_a_time_as_if_cut_whole():
    """``count_image`` holds one band of tiles at a time (``band_bytes``): the density map is the
    one the whole photo padded and cut at once gives (reflected edges included)."""
    import torch

    from workloads.flower.evaluate import predict_density
    from workloads.flower.model import FlowerCounterCNN
    from workloads.flower.predict import count_image

    torch.manual_seed(0)
    model = FlowerCounterCNN().eval()
    rgb = np.random.default_rng(7).integers(0, 255, (70, 45, 3), dtype=np.uint8)   # 3 x 2 tiles of 32, padded
    padded = cv2.copyMakeBorder(rgb, 0, 26, 0, 19, cv2.BORDER_REFLECT_101)
    tiles = padded.reshape(3, 32, 2, 32, 3).swapaxes(1, 2).reshape(-1, 32, 32, 3)
    with torch.inference_mode():
        maps, _ = predict_density(model, tiles, 100.0, 8, "cpu")
    whole = maps.reshape(3, 2, 32, 32).swapaxes(1, 2).reshape(96, 64)[:70, :45]
    one_row_a_band = count_image(model, rgb, 32, 100.0, batch_size=8, device="cpu", band_bytes=1)
    assert one_row_a_band.shape == (70, 45)
    np.testing.assert_allclose(one_row_a_band, whole, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(count_image(model, rgb, 32, 100.0, batch_size=8, device="cpu"), whole, rtol=1e-4, atol=1e-6)


def test_prediction_takes_the_device_explicitly_and_batches_tiles():
    from workloads.flower.evaluate import predict_density
    from workloads.flower.predict import count_image

    torch.manual_seed(0)
    model = FlowerCounterCNN().eval()
    images, _ = random_tiles(5)
    one_by_one, _ = predict_density(model, images, 100.0, batch_size=1, device="cpu")
    batched, _ = predict_density(model, images, 100.0, batch_size=4, device=torch.device("cpu"))
    assert batched.shape == (5, 32, 32) and (batched >= 0).all()
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-4, atol=1e-6)
    rgb = np.random.default_rng(3).integers(0, 255, (70, 45, 3), dtype=np.uint8)
    density = count_image(model, rgb, 32, 100.0, batch_size=2, device="cpu")
    assert density.shape == (70, 45)
    np.testing.assert_allclose(density, count_image(model, rgb, 32, 100.0), rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_prediction_on_cuda_counts_what_the_cpu_counts():
    from workloads.flower.evaluate import predict_density
    from workloads.flower.predict import count_image

    torch.manual_seed(0)
    model = FlowerCounterCNN().eval()
    images, _ = random_tiles(6, 64)
    on_cpu, _ = predict_density(model, images, 100.0, device="cpu")
    on_gpu, _ = predict_density(model, images, 100.0, batch_size=4, device="cuda")
    np.testing.assert_allclose(on_gpu.sum(axis=(1, 2)), on_cpu.sum(axis=(1, 2)), rtol=1e-3, atol=1e-3)
    rgb = np.random.default_rng(3).integers(0, 255, (150, 201, 3), dtype=np.uint8)
    assert float(count_image(model.cuda(), rgb, 64, 100.0).sum()) == pytest.approx(
        float(count_image(model.cpu(), rgb, 64, 100.0).sum()), rel=1e-3, abs=1e-3)
