"""The driver's progress line and the end-of-run summary."""
import io

from orchard.progress import ProgressLine, render, summary_table


def test_progress_line_shows_step_rates_and_eta():
    line = render({"step": 25, "total": 100, "desc": "epoch 2/4", "rates": {"img/s": 35.5}}, started=0.0, now=50.0,
                  label="flower/ring")
    assert "[flower/ring]" in line and "epoch 2/4" in line and "25/100" in line
    assert "img/s 35.5" in line
    assert "ETA 2m30s" in line  # 75 steps left at 2 s/step


def test_progress_is_quiet_when_not_a_tty():
    stream = io.StringIO()
    assert not ProgressLine(sink=None, label="x", mode="auto", stream=stream).enabled
    assert ProgressLine(sink=None, label="x", mode="always", stream=stream).enabled


def test_summary_table_keeps_run_level_figures_only():
    text = summary_table("orchard flower/ring: run", {"val/mae": 1.25, "system/node0/cpu_pct_mean": 50.0,
                                                      "system/cpu_pct_mean": 50.0}, ["view: mlflow ui ..."])
    assert "val/mae" in text and "system/cpu_pct_mean" in text
    assert "node0" not in text
    assert text.rstrip().endswith("view: mlflow ui ...")


def test_summary_table_leads_with_held_out_results():
    text = summary_table("t", {"baseline/mae": 2.0, "train/loss": 0.1, "test/mae": 0.5, "time/total_s": 3.0}, [])
    rows = [line.split()[0] for line in text.splitlines()[2:6]]
    assert rows == ["test/mae", "time/total_s", "train/loss", "baseline/mae"]
