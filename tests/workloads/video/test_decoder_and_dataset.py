"""Decoding exact frames at an offset, the short-video rule, and skip-and-count of bad files."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads.video.decoder import BadVideo, PyAVDecoder, wanted_indices
from workloads.video.synthetic_videos import render_clip, write_bad_files, write_mp4

from .conftest import pipeline_config


@pytest.mark.parametrize("offset", [0, 1, 7, 15, 16, 17, 19])
def test_decode_returns_exactly_the_frames_of_a_sequential_decode(tiny_videos, offset):
    _, index = tiny_videos
    dec = PyAVDecoder()
    path = index.paths[0]
    reference = dec.decode_all(path)                       # every frame, in order
    assert len(reference) == index.lengths[0] == 24
    clip = dec.decode(path, offset, 5, length=24)
    assert clip.shape == (5, 32, 32, 3) and clip.dtype == np.uint8
    assert np.array_equal(clip, reference[offset:offset + 5])


def test_long_gop_mpeg4_and_vp9_seek_to_the_right_frame(tmp_path):
    frames = render_clip("move_right", seed=1, size=32, num_frames=60)
    for codec, gop, ext in (("libx264", 250, "mp4"), ("mpeg4", 12, "mp4"), ("libvpx-vp9", 20, "webm")):
        path = tmp_path / f"{codec}.{ext}"
        write_mp4(path, frames, codec=codec, gop=gop)
        dec = PyAVDecoder()
        reference = dec.decode_all(str(path))
        assert np.array_equal(dec.decode(str(path), 41, 6, length=60), reference[41:47]), codec


def test_short_videos_loop_or_pad_as_documented(tiny_videos):
    _, index = tiny_videos
    path = index.paths[0]
    reference = PyAVDecoder().decode_all(path)
    looped = PyAVDecoder(short_rule="loop").decode(path, 21, 6, length=24)
    padded = PyAVDecoder(short_rule="pad").decode(path, 21, 6, length=24)
    assert np.array_equal(looped, reference[[21, 22, 23, 0, 1, 2]])
    assert np.array_equal(padded, reference[[21, 22, 23, 23, 23, 23]])
    assert wanted_indices(0, 4, 2, "loop") == [0, 1, 0, 1]


def test_resize_gives_the_configured_size(tiny_videos):
    _, index = tiny_videos
    assert PyAVDecoder(size=16).decode(index.paths[1], 3, 2, length=24).shape == (2, 16, 16, 3)


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


def test_a_file_that_breaks_after_the_scan_is_skipped_by_the_decode_stage(tmp_path, tiny_videos, ray_session):
    """The pipeline never stops for one bad file: the segment is dropped, counted and named."""
    import ray

    from workloads.video.master import start_master
    from workloads.video.pipeline import build_dataset, consume

    _, index = tiny_videos
    paths = [str(tmp_path / f"v{i}.mp4") for i in range(3)]
    for src, dst in zip(index.paths[:3], paths):
        Path(dst).write_bytes(Path(src).read_bytes())
    master = start_master([0, 1, 2], [24, 24, 24], seed=0)
    Path(paths[1]).write_bytes(Path(paths[1]).read_bytes()[:300])   # truncated after indexing
    segs = [{"video": v, "label": v, "offset": 2, "count": 5} for v in (0, 1, 2, 0, 1, 2)]
    ds = build_dataset(segs, ["rgb"], paths, [24, 24, 24], pipeline_config(), master=master)
    labels = np.concatenate([b["label"] for b, _ in consume(ds, 8, ["label"])])
    assert sorted(labels.tolist()) == [0, 0, 2, 2]
    assert list(ray.get(master.bad_files.remote())) == [paths[1]]
    assert ray.get(master.stage_stats.remote())["decode"]["bad"] == 2


def test_probe_rejects_each_kind_of_bad_file(tmp_path, tiny_videos):
    _, index = tiny_videos
    bad = write_bad_files(tmp_path, index.paths[0])
    dec = PyAVDecoder()
    for kind, path in bad.items():
        if kind == "zero_byte":
            continue  # the scan rejects it before probing (a clearer reason)
        with pytest.raises(BadVideo):
            dec.probe(path)
    assert dec.probe(index.paths[0]) == 24


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


def test_difficulty_knobs_are_repeatable_and_off_by_default():
    clean = render_clip("move_right", seed=5, size=32, num_frames=6)
    hard = render_clip("move_right", seed=5, size=32, num_frames=6, appearance_cue=1.0, noise=10, shake=1.0)
    assert np.array_equal(hard, render_clip("move_right", seed=5, size=32, num_frames=6, appearance_cue=1.0,
                                            noise=10, shake=1.0))       # a pure function of the seed
    assert np.abs(hard.astype(int) - clean).mean() > 3                 # the knobs change the pixels
    # appearance_cue=1: videos of one class share their class's tint, so colour hints at the label
    tint = lambda cls, s: render_clip(cls, seed=s, size=32, num_frames=1, appearance_cue=1.0)[0].reshape(-1, 3).mean(0)  # noqa: E731
    same = np.abs(tint("move_right", 1) / tint("move_right", 1).sum() - tint("move_right", 2) / tint("move_right", 2).sum())
    other = np.abs(tint("move_right", 1) / tint("move_right", 1).sum() - tint("move_left", 1) / tint("move_left", 1).sum())
    assert other.sum() > same.sum()
