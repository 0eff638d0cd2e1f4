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
