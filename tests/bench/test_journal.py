"""bench/journal.py: a bench's finished runs, one line each, kept where the bench is stopped. The
whole path (a scaling bench stopped part-way, its results file written from the journal) is in
tests/bench/test_scaling.py."""
from __future__ import annotations

import pytest

from bench import journal


def test_runs_are_kept_only_where_the_runner_named_a_journal_and_a_cut_last_line_is_dropped(monkeypatch, tmp_path):
    kept = journal.path_for(tmp_path, "scaling")
    journal.start(kept, {"bench": "scaling"})
    monkeypatch.delenv(journal.ENV, raising=False)
    journal.add({"workers": 1}, {"work_s": 1.0})  # no journal named: a bench's test, a direct call
    assert journal.read(kept) == ({"bench": "scaling"}, [])
    monkeypatch.setenv(journal.ENV, str(kept))
    journal.add({"workers": 1}, {"work_s": 1.0})
    journal.add({"workers": 2}, failed="exited 1")
    with open(kept, "a") as f:  # killed while writing a line
        f.write('{"key": {"work')
    header, runs = journal.read(kept)
    assert [r["key"] for r in runs] == [{"workers": 1}, {"workers": 2}]
    assert runs[0]["run"] == {"work_s": 1.0} and runs[1]["failed"] == "exited 1" and "load1" in runs[0]


def test_a_file_that_is_not_a_journal_is_refused_naming_it(tmp_path):
    bad = tmp_path / "x.runs.jsonl"
    bad.write_text('{"header": {}}\nnot json\n{"key": {}}\n')
    with pytest.raises(ValueError, match="x.runs.jsonl: line 2 is not JSON"):
        journal.read(bad)
    bad.write_text('{"key": {}}\n')
    with pytest.raises(ValueError, match="its first line is not a bench journal's header"):
        journal.read(bad)
    bad.write_text("")
    with pytest.raises(ValueError, match="empty"):
        journal.read(bad)
