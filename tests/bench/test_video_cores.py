"""bench/video_cores.py (issue 51's many-core video bench): which core counts it runs, the clips a
count gets (a share of the videos, as many clips a video at every count), and its rows: orchard
against each peer at each count, with each side's speed-up and efficiency from the first count
and the checksums compared. The passes themselves are bench/video_pipeline.py's, tested there."""
from __future__ import annotations

from collections import Counter

import pytest


def test_core_counts_double_up_to_the_machine_and_end_at_its_count():
    from bench.video_cores import core_counts

    assert core_counts(2) == [2] and core_counts(16) == [2, 4, 8, 16] and core_counts(12) == [2, 4, 8, 12]
    assert core_counts(2, [1, 2, 4]) == [1, 2]   # asked for, where the cores exist


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    from bench.video_cores import SIZES, clip_sets

    return clip_sets(str(tmp_path_factory.mktemp("video_cores")), SIZES["smoke"], 4)


def test_each_count_takes_its_share_of_the_videos_with_as_many_clips_a_video(sets):
    from bench.video_cores import CLIPS_PER_VIDEO, SIZES, segments_at

    count = SIZES["smoke"]["count"]
    half, whole = segments_at(2, 4, sets, count), segments_at(4, 4, sets, count)
    for n, at in ((2, half), (4, whole)):
        lone = Counter(s["video"] for s in at["lone"])
        assert set(lone.values()) == {2}   # two clips a video, end to end: no frame shared
        assert sorted(s["offset"] for s in at["lone"] if s["video"] == next(iter(lone))) == [0, count]
        assert len({sets["lone"].labels[v] for v in lone}) > 1   # the classes stay mixed
        videos = [v for v in range(len(sets["overlap"].paths)) if v % 4 < n]
        assert len(at["overlap"]) == CLIPS_PER_VIDEO * len(videos)
        assert {s["video"] for s in at["overlap"]} <= set(videos)
    assert len(whole["lone"]) == 2 * len(half["lone"])


def test_a_row_for_each_peer_at_each_count_with_speed_ups_from_the_first(monkeypatch, tmp_path):
    from bench import journal, video_cores

    def at_cores(n, cpus, sets, size, repeats):
        # orchard 100 frames/s a core; the loops 90; decord's checksum differs at 2 cores
        pass_s = {side: [(1000 / (rate * n), 7 if (side, n) != ("decord", 2) else 8)] * repeats
                  for side, rate in {"orchard lone": 100, "procs lone": 90, "procs lone to parent": 90,
                                     "orchard": 100, "procs": 90, "decord": 90}.items()}
        return {**pass_s, "frames": {"lone": 1000, "overlap": 1000}}

    monkeypatch.setattr(video_cores, "at_cores", at_cores)
    monkeypatch.setattr(video_cores, "clip_sets", lambda tmp, size, most: {})
    monkeypatch.setattr(video_cores.os, "sched_getaffinity", lambda pid: set(range(4)))
    kept = journal.path_for(tmp_path, "video_cores")
    journal.start(kept, {"bench": "video_cores"})
    monkeypatch.setenv(journal.ENV, str(kept))
    rows = video_cores.measure({**video_cores.SIZES["smoke"], "cores": None}, 3)
    # each count is kept as it ends: a bench stopped later gives the same rows for the counts it ran
    runs = journal.read(kept)[1]
    assert [r["key"] for r in runs] == [{"cores": 2}, {"cores": 4}]
    assert video_cores.rows_from_runs(video_cores.SIZES["full"], 4, runs) == rows
    assert video_cores.rows_from_runs(video_cores.SIZES["full"], 4, runs[:1]) == rows[:4]
    assert [r["name"].split(": orchard vs ")[0] for r in rows] == \
        [f"decode {what}, {n} cores" for n in (2, 4) for what in ["clips that share no frame (2 a video)"] * 2 +
         ["overlapping clips (40 a video)"] * 2]
    four = rows[4]
    assert four["name"].endswith("PyAV loop, 4 processes x 1 thread")
    assert four["quality"]["orchard"] == {"cores": 4, "speed-up from 2 cores": 2.0, "efficiency": 1.0, "frames": 1000}
    assert four["quality"]["peer"]["checksum"] == "equal to orchard's"
    decord_at_2 = rows[3]
    assert decord_at_2["quality"]["peer"]["checksum"].startswith("DIFFERS")
    assert decord_at_2["target"]["quality_ok"] is False and four["target"]["min_ratio"] == 1.0
