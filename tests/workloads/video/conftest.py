"""Small real video sets shared by the video tests (real H.264 MP4 files, written once)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_videos(tmp_path_factory):
    """3 motion classes x 4 videos, 32x32, 24 frames: ``(root, index)``."""
    from workloads.video.dataset import scan
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
