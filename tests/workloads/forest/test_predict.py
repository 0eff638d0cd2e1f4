"""forest's trained model as an MLflow pyfunc Model, loaded in a fresh process, and ``mode=predict``
through the CLI on real 16-bit depth PNGs (with their label PNGs beside), one of them corrupt."""
from __future__ import annotations

import csv
import shutil

import cv2
import numpy as np
import pytest

from tests.orchard.model_helpers import predict_cli, pyfunc_in_fresh_process
from tests.workloads.forest.helpers import rendered


@pytest.fixture(scope="module")
def trained(cli_run):
    run = cli_run("workload=forest")
    assert run.exit_code == 0, run.console[-3000:]
    return run


@pytest.mark.slow
def test_the_logged_forest_labels_a_depth_png_in_a_fresh_process(trained, tmp_path):
    from workloads.forest.predict import _load_pyfunc

    depth_png = rendered(trained.run_dir, "test")[0]
    depth = cv2.imread(str(depth_png), cv2.IMREAD_UNCHANGED)
    assert depth.dtype == np.uint16
    got = pyfunc_in_fresh_process(trained.uri, f"runs:/{trained.run_id}/model", depth[None], tmp_path)
    assert not got.ray_loaded
    assert got.metadata["orchard_workload"] == "forest"
    assert got.on_example.shape == got.example.shape and got.on_example.dtype == np.uint8
    assert got.on_file.shape == (1, *depth.shape)
    body = depth > 0
    assert (got.on_file[0][~body] == 31).all()   # no reading: background
    # the same labels as the model folder of the run, loaded here
    local = _load_pyfunc(str(next((trained.run_dir / "model").rglob("forest.json")).parent))
    np.testing.assert_array_equal(got.on_file, local.predict(depth[None]))


@pytest.mark.slow
def test_predict_writes_label_pngs_scores_pairs_and_skips_a_corrupt_png(trained, tmp_path):
    from workloads.forest.body_parts import BACKGROUND
    from workloads.forest.depth_png import palette_array, read_pair
    from workloads.forest.predict import _load_pyfunc
    from orchard.config import compose

    folder = tmp_path / "scenes"
    folder.mkdir()
    pairs = rendered(trained.run_dir, "test")[:2]
    for depth_png in pairs:
        shutil.copy(depth_png, folder)
        shutil.copy(str(depth_png).replace("_depth.png", "_labels.png"), folder)
    (folder / "broken_depth.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    cv2.imwrite(str(folder / "colour.png"), np.zeros((8, 8, 3), np.uint8))   # wrong channels and depth
    result = predict_cli(trained, "forest", str(trained.run_dir), folder, tmp_path)
    assert result.exit_code == 0, result.console[-3000:]
    assert "Traceback" not in result.console
    assert "skipped broken_depth.png" in result.console and "skipped colour.png" in result.console
    # the summary leads with what was predicted, not a training run's figures
    assert "predicted: 2 images (" in result.console and "2 skipped (skipped.csv says why)" in result.console
    # the predict run records the model it applied as its input (the run page's "Logged models")
    inputs = result.client.get_run(result.run.info.run_id).inputs   # search_runs leaves model inputs out
    assert [m.model_id for m in inputs.model_inputs] == [trained.run.outputs.model_outputs[0].model_id]
    with open(result.predictions / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["file"] for r in rows] == [p.name for p in pairs] and all(r["scored"] == "True" for r in rows)
    palette = palette_array(compose(["workload=forest"])["forest"]["palette"])
    model = _load_pyfunc(str(next((trained.run_dir / "model").rglob("forest.json")).parent))
    correct = total = 0
    for p in pairs:
        stem = p.name[:-len("_depth.png")]
        depth, truth = read_pair(folder / stem, palette)
        written = cv2.cvtColor(cv2.imread(str(result.predictions / "labels" / f"{stem}_labels.png")), cv2.COLOR_BGR2RGB)
        expected = model.labels(depth)
        np.testing.assert_array_equal(written, palette[expected])  # the training palette
        body = (truth != BACKGROUND) & (depth > 0)
        correct += int((expected[body] == truth[body]).sum())
        total += int(body.sum())
    m = result.metrics
    assert m["predict/images"] == 2 and m["predict/skipped"] == 2 and m["data/skipped_files"] == 2
    assert m["predict/pixel_accuracy"] == pytest.approx(correct / total)
    assert 0 <= m["predict/mean_class_accuracy"] <= 1 and any(k.startswith("predict/class_acc/") for k in m)
    # its time split says where the seconds went: the model, the inputs, the pass (not all in "close")
    assert {"time/split/model_s", "time/split/data_s", "time/split/predict_s"} <= set(m)
    assert m["time/split/predict_s"] > m["time/split/close_s"]


@pytest.mark.slow
def test_a_forest_model_is_refused_by_another_workload(trained, tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), np.zeros((8, 8, 3), np.uint8))
    result = predict_cli(trained, "flower", f"runs:/{trained.run_id}/model", folder, tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.console
    assert "model: a flower model;" in result.console and "is a forest model (use workload=forest)" in result.console
