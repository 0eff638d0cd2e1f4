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
