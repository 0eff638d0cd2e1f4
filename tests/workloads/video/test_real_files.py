"""Real files as users have them: VFR clips, still images, audio-only files, one-frame clips;
UCF101/HMDB51 split files; datasets the config check refuses with one line and exit 2."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from orchard import ConfigError
from workloads.video.decoder import BadVideo, PyAVDecoder

from .conftest import write_clip


def test_every_frame_of_a_vfr_file_matches_a_sequential_decode(tmp_path):
    path = tmp_path / "vfr.mp4"
    write_clip(path, 2, 1, vfr=True, n=40, seed=5)
    dec = PyAVDecoder()
    pts = dec.index(str(path))
    gaps = np.diff(pts)
    assert len(pts) == 40 and len(set(gaps.tolist())) > 1            # really variable frame rate
    reference = dec.decode_all(str(path))
    for offset in range(0, 36):                                      # every requested frame, seek or not
        clip = PyAVDecoder().decode(str(path), offset, 5, pts=pts)
        assert np.array_equal(clip, reference[offset:offset + 5]), offset
    # the short-video rule wraps in presented frames too
    assert np.array_equal(dec.decode(str(path), 38, 4), reference[[38, 39, 0, 1]])


def test_non_videos_are_rejected_by_kind(real_folder):
    dec = PyAVDecoder()
    kinds = {}
    for name in ("down/photo.jpg", "right/notes.mp4", "diagonal/voice.m4a", "diagonal/still.mp4"):
        with pytest.raises(BadVideo) as err:
            dec.index(str(real_folder / name))
        kinds[name] = err.value.kind
    assert kinds == {"down/photo.jpg": "image", "right/notes.mp4": "unreadable",
                     "diagonal/voice.m4a": "audio_only", "diagonal/still.mp4": "single_frame"}


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


def _ucf_layout(real_folder: Path, root: Path) -> Path:
    """UCF101 as downloaded: UCF-101/<class>/*.mp4 and ucfTrainTestlist/ beside it."""
    shutil.copytree(real_folder, root / "UCF-101")
    lists = root / "ucfTrainTestlist"
    lists.mkdir()
    (lists / "classInd.txt").write_text("1 right\n2 down\n3 diagonal\n")
    (lists / "trainlist01.txt").write_text("".join(f"{c}/{c}_{i}.mp4 {k}\n" for k, c in
                                                   enumerate(("right", "down", "diagonal"), 1) for i in (0, 1, 2)))
    (lists / "testlist01.txt").write_text("right/right_3.mp4\ndown/down_3.mp4\ndiagonal/diagonal_3.mp4\n"
                                          "down/photo.jpg\n")
    return root


def test_ucf101_split_files_are_read_as_they_are(real_folder, tmp_path):
    from workloads.video.data import scan

    root = _ucf_layout(real_folder, tmp_path / "ucf")
    found = scan(str(root / "UCF-101"))
    assert found.layout == "ucf101"
    assert found.classes == ["right", "down", "diagonal"]           # classInd.txt order
    val = sorted(Path(found.paths[i]).name for i in found.subset("val"))
    assert val == ["diagonal_3.mp4", "down_3.mp4", "right_3.mp4"]
    assert len(found.subset("train")) == 9
    assert list(found.skipped_kinds.values()) == ["image"]          # listed, but a photo


def test_hmdb51_split_files_are_read_as_they_are(real_folder, tmp_path):
    from workloads.video.data import scan

    root = tmp_path / "hmdb"
    shutil.copytree(real_folder, root)
    splits = root / "testTrainMulti_7030_splits"
    splits.mkdir()
    for c in ("right", "down", "diagonal"):
        (splits / f"{c}_test_split1.txt").write_text(f"{c}_0.mp4 1\n{c}_1.mp4 1\n{c}_2.mp4 2\n{c}_3.mp4 0\n")
    found = scan(str(root))
    assert found.layout == "hmdb51" and found.classes == ["diagonal", "down", "right"]
    assert len(found.paths) == 9 and len(found.subset("val")) == 3  # tag 0 = unused: left out


def test_one_class_or_a_class_without_videos_is_refused_by_the_config_check(real_folder, tmp_path, compose):
    import workloads.video as video

    one = tmp_path / "one" / "only"
    one.mkdir(parents=True)
    for f in (real_folder / "down").glob("*.mp4"):
        shutil.copy(f, one)
    with pytest.raises(ConfigError) as err:
        video.validate(compose("workload=video", f"video.root={one.parent}"))
    assert err.value.key == "video.root" and "at least 2 classes" in str(err.value)
    photos = tmp_path / "photos"
    shutil.copytree(real_folder, photos)
    for f in (photos / "down").glob("*.mp4"):
        f.unlink()                                                  # "down" keeps only photo.jpg
    with pytest.raises(ConfigError) as err:
        video.validate(compose("workload=video", f"video.root={photos}"))
    assert "none in 1 class(es): down" in str(err.value)
    video.validate(compose("workload=video", f"video.root={real_folder}"))   # the good folder passes


def test_the_cli_exits_2_with_one_line_on_a_one_class_folder(real_folder, tmp_path, capsys):
    from orchard.cli import main

    one = tmp_path / "one" / "only"
    one.mkdir(parents=True)
    shutil.copy(real_folder / "down" / "down_1.mp4", one)
    with pytest.raises(SystemExit) as exit_:
        main(["workload=video", "debug=smoke", f"video.root={one.parent}", "tracking=none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "video.root" in err[0]


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
