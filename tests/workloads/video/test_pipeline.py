"""workloads/video/pipeline.py: a file that breaks after the scan is skipped by the decode stage, not the end of the run."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .conftest import pipeline_config


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
