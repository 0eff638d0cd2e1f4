"""The driver's progress line and the end-of-run summary (headline first)."""
import io
import types

from orchard.terminal.progress import ProgressLine, render
from orchard.tracking import summary


def test_progress_line_shows_step_rates_and_eta():
    line = render({"step": 25, "total": 100, "desc": "epoch 2/4", "rates": {"img/s": 35.5}}, started=0.0, now=50.0,
                  label="flower/ring")
    assert "[flower/ring]" in line and "epoch 2/4" in line and "25/100" in line
    assert "img/s 35.5" in line
    assert "ETA 2m30s" in line  # 75 steps left at 2 s/step


def test_eta_counts_the_work_rate_not_the_start_up():
    # 60 s of start-up, then 10 steps in 10 s: 90 steps left at 1 s/step
    line = render({"step": 10, "total": 100}, started=0.0, now=70.0, label="x", first=(0, 60.0))
    assert "ETA 1m30s" in line
    # the first report after 60 s of start-up: no rate of the work's own yet, so no ETA (from the
    # elapsed time it would say 9m00s, start-up included)
    line = render({"step": 1, "total": 10}, started=0.0, now=60.0, label="x", first=(1, 60.0))
    assert "1/10" in line and "elapsed 1m00s" in line and "ETA" not in line


def test_progress_prints_plain_periodic_lines_when_not_a_tty():
    stream = io.StringIO()
    auto = ProgressLine(sink=None, label="x", mode="auto", stream=stream)
    assert auto.enabled and auto.every > 0          # a file or pipe: one plain line per period
    assert ProgressLine(sink=None, label="x", mode="always", stream=stream).every == 0
    assert not ProgressLine(sink=None, label="x", mode="never", stream=stream).enabled


def test_summary_leads_with_the_workloads_headline_then_speed_time_resources():
    from workloads import flower

    metrics = {"test/mae": 1.0, "test/baseline_mae": 2.0, "bin_0/mae": 9.0, "throughput/mean_images_per_s": 60.0,
               "throughput/std_images_per_s": 5.0, "time/total_s": 30.0, "system/cpu_pct_mean": 80.0,
               "system/run_cpu_pct_mean": 55.0, "system/node0/cpu_pct_mean": 80.0}
    lines = summary.headline(flower, {}, metrics)
    assert lines == ["count MAE: CNN 1 vs blob counter 2 (0.50x, better)"]
    text = summary.render("orchard flower/ring: r  FINISHED", lines, metrics, ["view: mlflow ui ..."]).splitlines()
    assert text[1] == "  " + lines[0]
    assert text[2].startswith("speed:") and "mean_images_per_s 60" in text[2] and "std_" not in text[2]
    assert text[3].startswith("time:") and "total 30.0 s" in text[3]
    assert text[4].startswith("resources:") and "CPU 80% (machine), this run 55%" in text[4]
    assert text[-1] == "view: mlflow ui ..." and "bin_0" not in "\n".join(text)


def test_summary_without_a_declared_headline_shows_held_out_results():
    plain = types.SimpleNamespace()
    assert summary.headline(plain, {}, {"train/loss": 0.1, "test/acc": 0.9}) == ["test/acc 0.9"]


def test_a_failed_run_without_results_falls_back_instead_of_crashing():
    from workloads import video

    assert summary.headline(video, {}, {"time/total_s": 3.0}) == []


def test_the_summary_ends_with_the_runs_page_in_the_ui_on_the_store_or_the_server():
    run = "0123456789abcdef0123456789abcdef"
    local = summary.view_lines("sqlite:////tmp/m.db", "3", run)
    assert local[0] == "view:      python -m orchard ui 01234567 tracking.uri=sqlite:////tmp/m.db"
    assert local[1].endswith(f"(opens http://127.0.0.1:5000/#/experiments/3/runs/{run}?workflowType=machine_learning)")
    assert summary.view_lines("sqlite:///mlflow.db", "3", run)[0] == "view:      python -m orchard ui 01234567"
    served = summary.view_lines("https://ml:secret@mlflow.example:8443/", "3", run)
    assert served[0] == f"view:      https://ml:***@mlflow.example:8443/#/experiments/3/runs/{run}?workflowType=machine_learning"
    assert served[1].startswith("server:    https://ml:***@mlflow.example:8443/") and "secret" not in " ".join(served)


def test_a_runs_description_says_what_it_is_and_what_a_sweeps_trial_was_given():
    cfg = {"workload": {"name": "flower"}, "strategy": {"name": "ps"}, "mode": "train",
           "_overrides": ["workload=flower", "strategy=ps", "debug=smoke", "flower.epochs=3",
                          "tracking.uri=sqlite:///x.db", "output_dir=/tmp/o"]}
    assert summary.description(cfg) == "**flower** ps · debug=smoke flower.epochs=3"
    parent = {"sweep.params.flower.optimizer.lr.type": "loguniform", "flower.optimizer.lr": "0.001", "seed": "0"}
    trial = summary.trial_values({"flower.optimizer.lr": "0.00042", "seed": "0", "run_name": "t1"}, parent)
    assert trial == {"flower.optimizer.lr": "0.00042"}
    assert summary.description(cfg, trial).endswith(" · trial flower.optimizer.lr=0.00042")
    flower = types.SimpleNamespace(headline_metric=lambda m: ("count_mae", m["test/mae"]))
    assert summary.headline_metrics(flower, {"test/mae": 0.5}) == {"headline/count_mae": 0.5}
    assert summary.headline_metrics(flower, {}) == {}   # a failed run has no result: no headline


def test_a_predict_runs_summary_says_what_was_predicted_how_fast_and_what_was_skipped():
    from workloads import flower

    metrics = {"predict/images": 12.0, "predict/images_per_s": 3.4, "predict/skipped": 1.0,
               "predict/total_count": 250.0, "predict/megapixels_per_s": 2.0, "time/total_s": 9.0}
    lines = summary.headline(flower, {"mode": "predict"}, metrics)
    assert lines == ["predicted: 12 images (3.4 images/s), 1 skipped (skipped.csv says why)", "total_count 250"]
    # a training run's summary is unchanged by predict-looking metrics it does not have
    assert summary.headline(flower, {"mode": "train"}, {"test/mae": 1.0, "test/baseline_mae": 2.0})[0].startswith("count MAE")
