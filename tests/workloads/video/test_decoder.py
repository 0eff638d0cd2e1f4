"""workloads/video/decoder.py: exact frames at an offset, long-GOP and VP9 seeks, the short-video rule,
the configured size, and each kind of bad file the probe rejects."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.video.decoder import BadVideo, PyAVDecoder, wanted_indices
from workloads.video.synthetic_videos import render_clip, write_bad_files, write_mp4

from .conftest import write_clip


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


def test_a_frame_scaled_while_converted_is_the_area_average_of_the_whole_frame(tmp_path):
    """A wide frame scaled to the square size by swscale (as it leaves YUV) is the picture cv2's
    INTER_AREA makes of the full-size RGB frame: the same brightness to a grey level (a crop or a
    one-pixel shift is 20-30 levels off); colours, which 4:2:0 video keeps at half resolution and
    swscale scales on their own plane, differ more on this clip's speckled colour noise."""
    import cv2

    wide = np.concatenate([render_clip("move_right", seed=3, size=96, num_frames=12)] * 2, axis=2)[:, :72]
    path = tmp_path / "wide.mp4"
    write_mp4(path, np.ascontiguousarray(wide))
    full = PyAVDecoder().decode(str(path), 4, 6, length=12)
    assert full.shape == (6, 72, 192, 3)
    scaled = PyAVDecoder(size=32).decode(str(path), 4, 6, length=12)
    reference = np.stack([cv2.resize(f, (32, 32), interpolation=cv2.INTER_AREA) for f in full])
    assert scaled.shape == reference.shape == (6, 32, 32, 3)
    grey = [np.stack([cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in x]).astype(int) for x in (scaled, reference)]
    assert np.abs(grey[0] - grey[1]).mean() < 1.5
    assert np.abs(scaled.astype(int) - reference).mean() < 20


def test_one_decoder_over_files_of_several_sizes_gives_pyavs_own_pixels(tmp_path, tiny_videos):
    """The decoder converts every frame through one swscale context it keeps (``_rgb``); frame by
    frame it must give what PyAV's own per-frame calls give (``to_ndarray`` at the file's size,
    ``reformat(..., interpolation="AREA")`` scaled), with files of other sizes and codecs in
    between, which the kept context must follow."""
    import av

    _, index = tiny_videos
    frames = render_clip("move_right", seed=2, size=48, num_frames=20)
    write_mp4(tmp_path / "wide.webm", np.ascontiguousarray(np.concatenate([frames, frames], axis=2)),
              codec="libvpx-vp9", gop=8)
    files = [index.paths[0], str(tmp_path / "wide.webm"), index.paths[1]]

    def plain(path, size):
        with av.open(path) as container:
            return np.stack([f.to_ndarray(format="rgb24") if f.width == f.height == size else
                             f.reformat(width=size, height=size, format="rgb24", interpolation="AREA").to_ndarray()
                             for f in container.decode(container.streams.video[0])])

    for size in (32, 24):
        dec = PyAVDecoder(size=size)
        for path in files * 2:
            assert np.array_equal(dec.decode_all(path), plain(path, size)), (path, size)


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


def test_clips_of_one_file_decoded_together_are_each_clip_decoded_alone(tmp_path, tiny_videos):
    """decode_many (the decode stage's one pass per file and batch): overlapping, adjacent, far
    apart and wrapping clips, on H.264, long-GOP MPEG-4, VP9 and a variable-frame-rate file."""
    _, index = tiny_videos
    frames = render_clip("move_right", seed=1, size=32, num_frames=60)
    files = [(index.paths[0], 24, [(0, 5), (2, 5), (19, 6), (10, 3), (2, 5)])]
    for codec, gop, ext in (("mpeg4", 12, "mp4"), ("libvpx-vp9", 20, "webm")):
        path = tmp_path / f"{codec}.{ext}"
        write_mp4(path, frames, codec=codec, gop=gop)
        files.append((str(path), 60, [(41, 6), (3, 4), (44, 6), (57, 6)]))
    write_clip(tmp_path / "vfr.mp4", 2, 1, vfr=True, n=40, seed=5)
    files.append((str(tmp_path / "vfr.mp4"), 40, [(30, 5), (0, 5), (38, 4), (12, 5)]))
    for path, length, requests in files:
        together = PyAVDecoder().decode_many(path, requests, length=length)
        alone = [PyAVDecoder().decode(path, offset, count, length=length) for offset, count in requests]
        assert [c.shape for c in together] == [c.shape for c in alone], path
        assert all(np.array_equal(a, b) for a, b in zip(together, alone)), path


def test_a_decoder_keeps_a_bounded_number_of_files_open_and_drops_one_that_failed(tmp_path, tiny_videos, monkeypatch):
    import workloads.video.decoder as decoder

    _, index = tiny_videos
    monkeypatch.setattr(decoder, "KEEP_OPEN", 3)
    dec = PyAVDecoder()
    for path in index.paths[:5]:
        dec.decode(path, 1, 2, length=24)
    assert list(dec._open_files) == index.paths[2:5]          # the 3 most recent, oldest first
    monkeypatch.setattr(decoder, "KEEP_OPEN_PIXELS", 2 * 32 * 32)   # and no more pixels than 2 of them
    dec.decode(index.paths[5], 1, 2, length=24)
    assert list(dec._open_files) == index.paths[4:6]
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(open(index.paths[0], "rb").read())
    pts = dec.index(str(broken))
    dec.decode(str(broken), 0, 2, pts=pts)
    assert str(broken) in dec._open_files
    with pytest.raises(BadVideo):                              # a frame the file does not hold
        dec.decode(str(broken), 22, 3, pts=np.append(pts, [pts[-1] + 1]))
    assert str(broken) not in dec._open_files                  # closed and forgotten
    dec.close()
    assert not dec._open_files
