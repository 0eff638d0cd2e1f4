"""workloads/video/layouts.py: the dataset layouts users have (class folders, UCF101/HMDB51 split
files as they are, a manifest CSV), and the ones refused before Ray starts: one line naming the
file (and the line), exit 2, no traceback."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchard import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _manifest(tmp_path, rows: str) -> Path:
    for name in ("a.mp4", "b.mp4", "c.mp4"):
        (tmp_path / name).write_bytes(b"\x00" * 64)  # never decoded: the rows are refused first
    path = tmp_path / "manifest.csv"
    path.write_text(rows)
    return path


@pytest.mark.parametrize("rows, line, says", [
    ("path,label\na.mp4,cat\nb.mp4,dog\nc.mp4\n", 4, "no label"),
    ("path,label\na.mp4,cat\nb.mp4,\n", 3, "no label"),
    ("path,label\na.mp4,cat\n,dog\n", 3, "no path"),
    ("path,label,split\na.mp4,cat,train\nb.mp4,dog,holdout\n", 3, "split 'holdout'"),
])
def test_a_bad_manifest_row_is_named_by_file_and_line(tmp_path, compose, rows, line, says):
    from workloads import video

    path = _manifest(tmp_path, rows)
    with pytest.raises(ConfigError) as err:
        video.validate(compose("workload=video", f"video.root={path}"))
    message = str(err.value)
    assert err.value.key == "video.root"
    assert f"{path} line {line}: {says}" in message and "path,label" in message
    assert "\n" not in message


def test_a_manifest_that_is_not_a_text_table_is_one_line(tmp_path, compose):
    from workloads import video

    path = _manifest(tmp_path, "")
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ConfigError) as err:
        video.validate(compose("workload=video", f"video.root={path}"))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_manifest_labels_and_paths_are_read_without_stray_spaces(tmp_path):
    from workloads.video.layouts import read_layout

    path = _manifest(tmp_path, "\ufeffpath , label,split\n a.mp4 ,cat ,TEST\nb.mp4,dog,\n")
    layout = read_layout(str(path))
    assert layout.classes == ["cat", "dog"]
    assert layout.rows == [(str(tmp_path / "a.mp4"), "cat", "val"), (str(tmp_path / "b.mp4"), "dog", None)]


def test_the_cli_refuses_a_row_without_a_label_before_ray_starts(tmp_path):
    path = _manifest(tmp_path, "path,label\na.mp4,cat\nb.mp4,dog\nc.mp4\n")
    proc = subprocess.run([sys.executable, "-m", "orchard", "workload=video", f"video.root={path}", "debug=smoke",
                           "tracking=none", f"output_dir={tmp_path}/out"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 2, console
    assert "traceback" not in console.lower()
    assert f"{path} line 4: no label" in console
    assert not (tmp_path / "out" / "logs").exists()  # refused before the console moved to a log: before Ray


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
