"""Every workload's figures (workloads/<w>/figures.py) reach MLflow as real, non-blank PNGs under
``figures/``, from the shared CLI smoke runs (tests/conftest.py ``cli_run``)."""
from __future__ import annotations

import pytest

FIGURES = {
    ("workload=flower", "strategy=ring"): {"density_maps", "per_bin_mae", "counts_scatter"},
    ("workload=forest",): {"predicted_labelings", "class_accuracy", "confusion_matrix", "phase_times"},
    ("workload=video",): {"confusion_matrix", "learning_curves", "pipeline_timeline", "highlights"},
    ("workload=singa", "singa.arch=local"): {"learning_curves", "tsne_fc1", "tsne_fc5"},
}


def _read_png(client, run_id: str, path: str, tmp_path):
    import matplotlib.image

    local = client.download_artifacts(run_id, path, str(tmp_path))
    with open(local, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return matplotlib.image.imread(local)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", list(FIGURES), ids=lambda o: "-".join(v.split("=")[1] for v in o))
def test_smoke_run_logs_its_figures_as_readable_pngs(cli_run, overrides, tmp_path):
    run = cli_run(*overrides)
    assert run.exit_code == 0, run.console[-3000:]
    logged = {p.removeprefix("figures/").removesuffix(".png") for p in run.artifacts("figures")}
    assert FIGURES[overrides] <= logged, f"missing figures: {FIGURES[overrides] - logged}"
    for name in sorted(FIGURES[overrides]):
        pixels = _read_png(run.client, run.run_id, f"figures/{name}.png", tmp_path)
        height, width = pixels.shape[:2]
        # big enough to read (matplotlib figures at 100 dpi), and something drawn on it
        assert height >= 250 and width >= 350, f"{name}.png is {width}x{height}"
        assert pixels[..., :3].std() > 0.05, f"{name}.png is blank"


@pytest.mark.slow
def test_video_highlights_show_every_untrimmed_video(cli_run, tmp_path):
    """One panel per untrimmed video of the run (debug=smoke makes two): the figure grows with them."""
    run = cli_run("workload=video")
    local = run.client.download_artifacts(run.run_id, "tables/untrimmed_predictions.json", str(tmp_path))
    import json

    videos = json.load(open(local))["videos"]
    assert len(videos) == 2
    pixels = _read_png(run.client, run.run_id, "figures/highlights.png", tmp_path)
    assert pixels.shape[0] >= 200 * len(videos)
