"""orchard/tracking/datasets.py: a run's data as an MLflow dataset, its digest from the data's content or the
generator's settings (the end-to-end record on real runs: tests/integration/test_mlflow_ui.py)."""
from __future__ import annotations

import warnings

from orchard.tracking.datasets import training_data


def test_synthetic_data_is_named_by_its_generator_and_digested_by_its_settings(compose):
    cfg = compose("workload=flower", "debug=smoke")
    first, again = training_data(cfg), training_data(compose("workload=flower", "debug=smoke"))
    assert first.name == "synthetic field 2x576x384" and first.source._get_source_type() == "code"
    assert first.digest == again.digest                       # same settings, same data: one dataset
    assert training_data(compose("workload=flower", "debug=smoke", "seed=1")).digest != first.digest
    assert training_data(compose("workload=flower", "debug=smoke", "flower.epochs=5")).digest == first.digest


def test_a_users_folder_is_digested_by_its_content(compose, tmp_path):
    folder = tmp_path / "field"
    (folder / "images").mkdir(parents=True)
    (folder / "images" / "a.png").write_bytes(b"one")
    (folder / "points.csv").write_text("image,x,y\n")
    cfg = compose("workload=flower", f"flower.data_dir={folder}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = training_data(cfg)
    assert not caught, [str(w.message) for w in caught]   # MLflow's two local sources: not the user's to read
    assert first.name == "field photos field" and str(folder) in first.source.to_json()
    assert training_data(cfg).digest == first.digest
    (folder / "images" / "a.png").write_bytes(b"two")        # same name and size, other bytes
    assert training_data(cfg).digest != first.digest
