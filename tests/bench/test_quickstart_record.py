"""bench/quickstart_record.py reads CI's figures from its log: the counts and seconds of pytest's
last summary line, whatever precedes it (the durations table, a failed test's output), and
the seconds, install and exit of `.ci/run`'s own last line."""
from __future__ import annotations

import pytest


def test_the_last_summary_line_gives_the_counts_and_seconds():
    from bench.quickstart_record import pytest_counts

    log = ("tests/a.py ....\n============= slowest 30 durations =============\n12.00s call tests/a.py::t\n"
           "=== 3 failed, 780 passed, 3 skipped, 1 error, 8 warnings in 1834.52s (0:30:34) ===\n"
           "ci: 1990 s in all: install 150 s, tests 1840 s (exit 1)\n")
    assert pytest_counts(log) == {"passed": 780, "skipped": 3, "failed": 4, "tests_s": 1834.52}


def test_a_log_without_a_summary_is_refused():
    from bench.quickstart_record import pytest_counts

    with pytest.raises(SystemExit, match="no pytest summary line"):
        pytest_counts("pip install failed\n")


def test_cis_own_last_line_gives_the_whole_runs_seconds_its_install_and_exit():
    from bench.quickstart_record import ci_line

    log = ("=== 930 passed, 3 skipped in 2469.53s (0:41:09) ===\n"
           "ci: 2545 s in all: install 64 s, tests 2481 s (exit 0)\n")
    assert ci_line(log) == {"ci_total_s": 2545.0, "install_s": 64.0, "ci_exit": 0}
    assert ci_line("=== 1 passed in 2.0s ===\n") == {}  # a log cut before .ci/run's last line


def test_a_recorded_log_is_dated_when_it_was_last_written_unless_told(tmp_path, monkeypatch):
    """A figure without its date renders as "None" in the README (it did, for c797af9's CI)."""
    import json
    import os

    from bench import quickstart_record

    log = tmp_path / "ci.log"
    log.write_text("=== 9 passed in 20.0s ===\nci: 30 s in all: install 10 s, tests 20 s (exit 0)\n")
    os.utime(log, (1_764_806_400, 1_764_806_400))  # 2025-12-04 00:00:00 UTC
    monkeypatch.setattr(quickstart_record, "RECORD", tmp_path / "quickstart.json")
    quickstart_record.main(["--from-log", str(log), "--commit", "abc1234", "--load", "1.0,2.0"])
    dates = json.loads((tmp_path / "quickstart.json").read_text())["measured_utc"]
    assert dates["tests_s"] == dates["ci_total_s"] == dates["load_after"] == "2025-12-04T00:00:00+00:00"
    quickstart_record.main(["--from-log", str(log), "--commit", "abc1234", "--when", "2026-01-02T03:04:05+00:00"])
    assert json.loads((tmp_path / "quickstart.json").read_text())["measured_utc"]["passed"] == "2026-01-02T03:04:05+00:00"
