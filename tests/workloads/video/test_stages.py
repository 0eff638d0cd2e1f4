"""workloads/video/stages.py: the decode stage fills one array per batch, one pass per file, and,
fused, runs the feature extractors on its own frames with the same result as the stages apart."""
from __future__ import annotations

import numpy as np

from workloads.video.decoder import PyAVDecoder
from workloads.video.stages import DecodeStage, ExtractStage

from .conftest import pipeline_config


def _batch(rows):
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def _stage(index, **kw):
    v = pipeline_config()
    return DecodeStage(index.paths, index.lengths, v["size"], v["short_rule"], v["decoder"], pts=index.pts,
                       digests=index.digests, **kw)


def _extract(index, names):
    v = pipeline_config()
    return [dict(name=n, options=dict(v["extractor_options"].get(n) or {}), stack=v["stack"], paths=index.paths,
                 size=v["size"], drop_frames=i == len(names) - 1, digests=index.digests) for i, n in enumerate(names)]


def test_a_batch_is_one_contiguous_array_of_each_clips_exact_frames(tiny_videos):
    _, index = tiny_videos
    rows = [{"video": v, "label": index.labels[v], "offset": o, "count": 5} for v, o in ((0, 2), (1, 0), (0, 19), (0, 4))]
    out = _stage(index)(_batch(rows))
    assert out["frames"].shape == (4, 5, 32, 32, 3) and out["frames"].flags.c_contiguous
    for row, clip in zip(rows, out["frames"]):
        alone = PyAVDecoder(size=32).decode(index.paths[row["video"]], row["offset"], 5, length=24)
        assert np.array_equal(clip, alone)
    assert out["label"].tolist() == [r["label"] for r in rows]


def test_fused_extractors_give_the_features_of_the_stages_apart_and_no_frames(tiny_videos):
    _, index = tiny_videos
    rows = _batch([{"video": v, "label": index.labels[v], "offset": o, "count": 5} for v, o in ((0, 2), (3, 7), (0, 11))])
    fused = _stage(index, extract=_extract(index, ["rgb", "flow"]))(rows)
    apart = _stage(index)(rows)
    for kwargs in _extract(index, ["rgb", "flow"]):
        apart = ExtractStage(**kwargs)(apart)
    assert "frames" not in fused and "frames" not in apart
    assert set(fused) == set(apart)
    for name in ("rgb", "flow", "video", "offset"):
        assert np.array_equal(fused[name], apart[name]), name
