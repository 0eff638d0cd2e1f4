"""workloads/video/data.py: a dataset scanned, its bad files skipped, counted and named, a manifest's splits."""
from __future__ import annotations

from pathlib import Path

from workloads.video.synthetic_videos import write_bad_files


def _folder_with_bad_files(root: Path, good: list[str]) -> dict[str, str]:
    cls = root / "move_right"
    cls.mkdir(parents=True)
    for i, p in enumerate(good):
        (cls / f"good_{i}.mp4").write_bytes(Path(p).read_bytes())
    other = root / "move_left"
    other.mkdir()
    (other / "good.mp4").write_bytes(Path(good[0]).read_bytes())
    (other / "good2.mp4").write_bytes(Path(good[1]).read_bytes())
    return write_bad_files(cls, good[0])


def test_scan_skips_counts_and_names_corrupt_truncated_empty_and_text_files(tmp_path, tiny_videos, ray_session):
    from workloads.video.data import scan

    _, index = tiny_videos
    bad = _folder_with_bad_files(tmp_path / "data", index.paths[:3])
    found = scan(str(tmp_path / "data"), val_fraction=0.5, seed=0)
    assert len(found.paths) == 5
    assert set(found.skipped) == set(bad.values())
    assert "zero-byte" in found.skipped[bad["zero_byte"]]
    assert all(reason for reason in found.skipped.values())
    assert found.classes == ["move_left", "move_right"]
    assert found.splits.count("val") == 3       # per class: round(3 * 0.5) = 2 and round(2 * 0.5) = 1


def test_a_manifest_csv_with_relative_paths_and_given_splits(tmp_path, tiny_videos):
    from workloads.video.data import scan

    _, index = tiny_videos
    for i, p in enumerate(index.paths[:3]):
        (tmp_path / f"clip{i}.mp4").write_bytes(Path(p).read_bytes())
    (tmp_path / "list.csv").write_text("path,label,split\nclip0.mp4,jump,train\nclip1.mp4,run,val\n"
                                       "clip2.mp4,jump,val\nmissing.mp4,run,train\n")
    found = scan(str(tmp_path / "list.csv"))
    assert found.classes == ["jump", "run"]
    assert [Path(p).name for p in found.paths] == ["clip0.mp4", "clip1.mp4", "clip2.mp4"]
    assert found.labels == [0, 1, 0] and found.splits == ["train", "val", "val"]
    assert list(found.skipped) == [str(tmp_path / "missing.mp4")]


def test_scan_counts_skips_by_kind_and_reuses_the_frame_index(real_folder, tmp_path):
    from workloads.video.data import scan

    store = tmp_path / "index"
    first = scan(str(real_folder), val_fraction=0.25, seed=0, index_dir=str(store))
    assert first.classes == ["diagonal", "down", "right"] and len(first.paths) == 12
    assert first.skipped_counts() == {"image": 1, "unreadable": 1, "audio_only": 1, "single_frame": 1}
    vfr = first.paths.index(str(real_folder / "right" / "right_0.mp4"))
    assert first.lengths[vfr] == 24 and len(first.pts[vfr]) == 24
    assert first.index_reused == 0
    again = scan(str(real_folder), val_fraction=0.25, seed=0, index_dir=str(store))
    assert again.index_reused == 16                                 # nothing decoded the second time
    assert [p.tolist() for p in again.pts] == [p.tolist() for p in first.pts]
    assert again.digests == first.digests and len(set(first.digests)) == 12
    assert again.splits == first.splits                              # the seeded split repeats


def test_a_video_linked_from_outside_the_folder_is_set_aside_and_never_opened(tmp_path):
    """A class folder's link to a file elsewhere (/etc/passwd) is neither probed nor decoded:
    set aside (``scan`` counts it as ``outside_folder``)."""
    from workloads.video.layouts import read_layout

    (tmp_path / "root" / "run").mkdir(parents=True)
    (tmp_path / "root" / "run" / "a.mp4").write_bytes(b"not probed here")
    (tmp_path / "root" / "run" / "b.mp4").symlink_to("/etc/passwd")
    layout = read_layout(str(tmp_path / "root"))
    assert [Path(r[0]).name for r in layout.rows] == ["a.mp4"]
    assert list(layout.outside) == [str(tmp_path / "root" / "run" / "b.mp4")]
