"""workloads/video/train.py: the driver's side of the two streams' training."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.video_shift import SIZES
from workloads.video.train import shift_workers


def test_worker_shifting_rule_moves_one_worker_to_the_lagging_stream():
    alloc, why = shift_workers({"spatial": 2, "temporal": 1}, {"spatial": 0.5, "temporal": 1.0}, 1.2, 1)
    assert alloc == {"spatial": 1, "temporal": 2} and "temporal lags" in why
    same, _ = shift_workers({"spatial": 2, "temporal": 1}, {"spatial": 0.9, "temporal": 1.0}, 1.2, 1)
    assert same == {"spatial": 2, "temporal": 1}
    floor, why = shift_workers({"spatial": 1, "temporal": 1}, {"spatial": 0.5, "temporal": 1.0}, 1.2, 1)
    assert floor == {"spatial": 1, "temporal": 1} and "minimum" in why


@pytest.mark.slow
def test_a_shift_moves_a_worker_between_the_streams_and_every_epoch_still_trains_once(run_orchard, tmp_path):
    """The notes' worker shifting on a real run (``video.shift_apply=true``, docs/video.md): the
    rule moves a Train worker between the streams' runs at an epoch mark (ratio 1.0 makes any gap
    in validation loss a shift; shallow queues keep the feeder within an epoch or two of the
    trainers, so the shift lands inside the run), the total count is kept, and every epoch is still
    trained and validated once by each stream. bench/video_shift.py times this run against the
    rule logged only."""
    res = run_orchard("workload=video", *SIZES["smoke"]["overrides"], "video.shift_apply=true")
    assert res.exit_code == 0, res.run.data.tags.get("orchard.error")
    m = res.run.data.metrics
    assert m["pipeline/shifts_applied"] >= 1 and m["pipeline/shift_wait_s"] >= 0
    table = res.client.download_artifacts(res.run.info.run_id, "tables/worker_allocation.json", str(tmp_path))
    history = json.loads(Path(table).read_text())["epochs"]
    assert [h for h in history if "applied from epoch" in h["shift_rule"]], history
    # the counts that trained each epoch: 2 + 2 at first, then one worker moved (the total is kept)
    per_epoch = [{s: h["workers"][s] for s in ("spatial", "temporal")} for h in history]
    assert per_epoch[0] == {"spatial": 2, "temporal": 2}
    assert any(w != per_epoch[0] for w in per_epoch) and all(sum(w.values()) == 4 for w in per_epoch)
    assert m["train/epochs_run"] == 4  # every epoch trained and validated once by each stream, relaunch or not
    for stream in ("spatial", "temporal"):
        steps = [h.step for h in res.client.get_metric_history(res.run.info.run_id, f"val/{stream}_top1")]
        assert sorted(steps) == [0, 1, 2, 3], (stream, steps)


@pytest.mark.slow
def test_the_summary_shows_each_streams_wait_and_its_worst_epoch():
    import workloads.video as video
    from workloads.video.train import wait_fractions

    m = wait_fractions({"spatial": [0.02, 0.12, 0.04], "temporal": [0.05]})
    assert m["pipeline/spatial_trainer_wait_fraction_max"] == 0.12
    assert abs(m["pipeline/spatial_trainer_wait_fraction_mean"] - 0.06) < 1e-9
    m |= {"val/agg_avg_top1": 0.9, "val/chance_top1": 0.5, "val/spatial_top1": 0.8, "val/temporal_top1": 0.7}
    assert video.headline({}, m)[1] == "trainers waited: spatial 6% (worst epoch 12%), temporal 5% (worst epoch 5%)"
