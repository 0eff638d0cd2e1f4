"""workloads/video/synthetic_videos.py: the generator's difficulty knobs."""
from __future__ import annotations

import numpy as np

from workloads.video.synthetic_videos import render_clip


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


def test_mixed_footage_is_real_h264_at_each_size_with_its_copies_as_a_class(tmp_path):
    import av

    from workloads.video.synthetic_videos import MIXED_SIZES, write_mixed_footage

    root = write_mixed_footage(tmp_path, copies=2, num_frames=6)
    for name, ((w, h), _) in MIXED_SIZES.items():
        files = sorted((root / name).glob("*.mp4"))
        assert len(files) == 2 and files[0].read_bytes() == files[1].read_bytes()
        with av.open(str(files[0])) as c:
            stream = c.streams.video[0]
            assert (stream.codec_context.name, stream.width, stream.height) == ("h264", w, h)
            assert len(list(c.decode(stream))) == 6


def _encoded(seed: int, times: int, folder: str) -> set[str]:
    import hashlib
    import os

    from workloads.video.synthetic_videos import write_mp4

    clip, out = render_clip("move_right", seed=seed, size=32, num_frames=16, appearance_cue=0.5, noise=10), set()
    for i in range(times):
        path = os.path.join(folder, f"{os.getpid()}_{i}.mp4")
        write_mp4(path, clip)
        out.add(hashlib.md5(open(path, "rb").read()).hexdigest())
    return out


def test_the_same_frames_encode_to_the_same_bytes_while_other_encoders_run(tmp_path):
    """A run's figures depend on its seed only: its synthetic videos are the same bytes however busy
    the machine (x264's mbtree gave others under load: 2-5 different files in 40 encodes), and the
    files keep their B-frames (presentation order differs from decode order)."""
    from concurrent.futures import ProcessPoolExecutor

    import av

    with ProcessPoolExecutor(3) as pool:
        found = set().union(*pool.map(_encoded, [12345] * 3, [25] * 3, [str(tmp_path)] * 3))
    assert len(found) == 1
    with av.open(str(next(tmp_path.glob("*.mp4")))) as c:
        pts = [p.pts for p in c.demux(video=0) if p.pts is not None]
    assert pts != sorted(pts)
