"""orchard/tracking/skipped.py for mode=predict inputs: what a user's folder holds that cannot be read
(a link to nothing, a folder named like an image) is set aside with its kind before anything is
staged, and a predict run's rows become skipped.csv and data/skipped_* metrics."""
from __future__ import annotations

from orchard.tracking import skipped


def test_inputs_that_cannot_be_opened_are_set_aside_with_their_kind(tmp_path):
    (tmp_path / "good.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))
    (tmp_path / "gone.png").symlink_to(tmp_path / "deleted.png")          # a link to nothing
    (tmp_path / "album.png").mkdir()                                       # a folder named like a photo
    (tmp_path / ".hidden.png").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not an input")
    listed = skipped.listed_inputs(tmp_path, (".png",))
    assert [p.name for p in listed] == ["gone.png", "good.png"]           # folders are not inputs at all
    good, bad = skipped.readable(listed + [tmp_path / "album.png"])
    assert [p.name for p in good] == ["good.png"]
    assert [(s.file, s.kind) for s in bad] == [("gone.png", "missing"), ("album.png", "not_file")]
    assert bad[0].reason == "a link to nothing"
    rows = skipped.as_rows(bad, tmp_path) + [{"path": str(tmp_path / "good.png"), "error": ""},
                                             {"path": "x/broken.png", "error": "truncated", "kind": "truncated"}]
    assert skipped.metrics(skipped.from_rows(rows)) == {"data/skipped_files": 3.0, "data/skipped_files/missing": 1.0,
                                                        "data/skipped_files/not_file": 1.0, "data/skipped_files/truncated": 1.0}


def test_the_kind_of_a_reading_error():
    from PIL import Image

    from workloads.flower.data import PhotoError

    assert skipped.kind_of(PhotoError("too_large", "200 MP")) == "too_large"
    assert skipped.kind_of(Image.DecompressionBombError("bomb")) == "too_large"
    assert skipped.kind_of(FileNotFoundError("x")) == "missing"
    assert skipped.kind_of(PermissionError("x")) == "unreadable"
    assert skipped.kind_of(ValueError("not a readable image")) == "corrupt"
