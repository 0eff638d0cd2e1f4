"""A manifest CSV that does not say what a row is (no label, no path, an unknown split, not a table)
is refused before Ray starts: one line naming the file and the line, exit 2, no traceback."""
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
