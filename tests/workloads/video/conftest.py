"""Small real video sets shared by the video tests (real H.264 MP4 files, written once)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_videos(tmp_path_factory):
    """3 motion classes x 4 videos, 32x32, 24 frames: ``(root, index)``."""
    from workloads.video.data import scan
    from workloads.video.synthetic_videos import generate_dataset

    root = generate_dataset(tmp_path_factory.mktemp("videos"), num_classes=3, videos_per_class=4,
                            size=32, num_frames=24, seed=3)
    return root, scan(str(root), val_fraction=0.25, seed=0)


def pipeline_config(**overrides) -> dict:
    """The ``video`` config keys the pipeline reads, at test sizes."""
    cfg = dict(size=32, stack=4, short_rule="loop", decoder="pyav",
               extractor_options={"flow": {"method": "dis_fast", "bound": 20}},
               pipeline_batch=4, decode_concurrency=1, decode_cpus=0.25, extract_concurrency=1, extract_cpus=0.25)
    cfg.update(overrides)
    return cfg


def write_clip(path, dx: int, dy: int, vfr: bool = False, n: int = 24, size: int = 32, seed: int = 0) -> None:
    """A real H.264 file of a square moving by (dx, dy) px per frame; ``vfr``: frame gaps of 20/40/60 ms."""
    from fractions import Fraction

    import av
    import numpy as np

    out = av.open(str(path), "w")
    s = out.add_stream("libx264", rate=25)
    s.width = s.height = size
    s.pix_fmt = "yuv420p"
    s.codec_context.time_base = s.time_base = Fraction(1, 1000)
    s.codec_context.gop_size = 8
    rng, pts = np.random.default_rng(seed), 0
    for i in range(n):
        img = np.full((size, size, 3), 40 + 3 * i, np.uint8)
        x, y = (2 + 3 * seed + dx * i) % (size - 8), (2 + 5 * seed + dy * i) % (size - 8)
        img[y:y + 8, x:x + 8] = (220, 200, 60)
        f = av.VideoFrame.from_ndarray(img, format="rgb24")
        f.pts, f.time_base = pts, Fraction(1, 1000)
        pts += int(rng.choice([20, 40, 60])) if vfr else 40
        for p in s.encode(f):
            out.mux(p)
    for p in s.encode():
        out.mux(p)
    out.close()


def write_audio_only(path) -> None:
    """A real AAC-in-MP4 file with no video stream."""
    import av
    import numpy as np

    out = av.open(str(path), "w")
    s = out.add_stream("aac", rate=16000)
    samples = (np.sin(np.arange(16000) / 10) * 0.3).astype(np.float32)[None]
    for i in range(0, 16000, 1024):
        frame = av.AudioFrame.from_ndarray(samples[:, i:i + 1024], format="fltp", layout="mono")
        frame.sample_rate = 16000
        for p in s.encode(frame):
            out.mux(p)
    for p in s.encode():
        out.mux(p)
    out.close()


def write_jpeg(path) -> None:
    import numpy as np
    from PIL import Image

    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype("uint8")).save(str(path))


@pytest.fixture(scope="session")
def real_folder(tmp_path_factory):
    """3 classes of written clips (one VFR per class) beside a JPEG, a text .mp4, audio-only and 1-frame files."""
    root = tmp_path_factory.mktemp("real") / "clips"
    for c, (dx, dy) in {"right": (2, 0), "down": (0, 2), "diagonal": (2, 2)}.items():
        (root / c).mkdir(parents=True)
        for i in range(4):
            write_clip(root / c / f"{c}_{i}.mp4", dx, dy, vfr=(i == 0), seed=i)
    write_jpeg(root / "down" / "photo.jpg")
    (root / "right" / "notes.mp4").write_text("not a video\n")
    write_audio_only(root / "diagonal" / "voice.m4a")
    write_clip(root / "diagonal" / "still.mp4", 0, 0, n=1)
    return root
