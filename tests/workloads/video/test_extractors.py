"""Each extractor's output shape and dtype, known-answer cases, and open registration."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from workloads.video import extractors
from workloads.video.extractors import build_extractor, register


def _texture(size=64, seed=0):
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (size // 4, size // 4), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC), (3, 3), 0)


def _translating_clip(dx: float, dy: float, frames: int, size=64) -> np.ndarray:
    base = _texture(size * 2)
    out = []
    for t in range(frames):
        m = np.float32([[1, 0, dx * t], [0, 1, dy * t]])
        g = cv2.warpAffine(base, m, (size * 2, size * 2), borderMode=cv2.BORDER_REFLECT)
        g = g[size // 2:size // 2 + size, size // 2:size // 2 + size]
        out.append(np.repeat(g[..., None], 3, axis=2))
    return np.stack(out)


@pytest.mark.parametrize("name,shape", [("rgb", (3, 32, 32)), ("framediff", (4, 32, 32)),
                                        ("flow", (8, 32, 32)), ("hog", (9, 4, 4))])
def test_output_shapes_and_dtypes(name, shape):
    ext = build_extractor(name, stack=4)
    frames = np.random.default_rng(0).integers(0, 256, (ext.frames_needed(4), 32, 32, 3), dtype=np.uint8)
    out = ext(frames)
    assert out.shape == shape
    assert out.dtype == np.uint8          # quantized for transmission


@pytest.mark.parametrize("method", ["farneback", "dis_fast", "dis_medium"])
def test_flow_known_answer_for_a_uniform_translation(method):
    ext = build_extractor("flow", stack=3, method=method)
    q = ext(_translating_clip(2.0, -1.0, 4))                  # (2L, H, W) quantized
    flow = ext.dequantize(q)
    centre = (slice(None), slice(16, 48), slice(16, 48))       # away from the borders
    fx, fy = flow[0::2][centre].mean(), flow[1::2][centre].mean()
    # the scene moves +2 px in x and -1 px in y per frame; quantization step is 40/255 px
    assert fx == pytest.approx(2.0, abs=0.3)
    assert fy == pytest.approx(-1.0, abs=0.3)


@pytest.mark.parametrize("method", ["farneback", "dis_medium"])
def test_a_block_of_overlapping_clips_gets_each_frame_pairs_flow_once_and_the_clip_by_clip_stacks(method, monkeypatch):
    from workloads.video.extractors import extract_many

    video = _translating_clip(1.5, 0.5, 14, size=32)
    video[7] = 255 - video[7]                       # a cut: pairs differ along the video
    clips = [video[o:o + 5] for o in (0, 2, 3, 9, 2)]   # overlapping, one repeated
    ext = build_extractor("flow", stack=4, method=method)
    one_by_one = np.stack([ext(c) for c in clips])
    calls = []
    pair = ext._pair
    monkeypatch.setattr(ext, "_pair", lambda a, b: calls.append(1) or pair(a, b))
    assert np.array_equal(extract_many(ext, clips), one_by_one)
    # the clips hold the pairs starting at frames 0-3, 2-5, 3-6, 9-12 and 2-5 again: 11 distinct of 20
    assert len(calls) == 11


def test_extractors_without_many_are_called_clip_by_clip():
    from workloads.video.extractors import extract_many

    clips = [np.full((5, 8, 8, 3), v, np.uint8) for v in (0, 100)]
    ext = build_extractor("framediff", stack=4)
    assert not hasattr(ext, "many")
    assert np.array_equal(extract_many(ext, clips), np.stack([ext(c) for c in clips]))


def test_flow_quantization_round_trips_and_clips_at_the_bound():
    ext = build_extractor("flow", stack=1, bound=20)
    values = np.array([-30.0, -20.0, 0.0, 5.0, 20.0, 31.0], np.float32)
    back = ext.dequantize(ext.quantize(values))
    assert np.allclose(back, [-20, -20, 0, 5, 20, 20], atol=20 / 255 + 1e-6)


def test_framediff_known_answer():
    frames = np.zeros((3, 8, 8, 3), np.uint8)
    frames[1] = 100
    frames[2] = 40
    d = build_extractor("framediff", stack=2)(frames).astype(int) * 2 - 255
    assert np.all(np.abs(d[0] - 100) <= 1) and np.all(np.abs(d[1] + 60) <= 1)


def test_hog_puts_a_vertical_edge_in_the_horizontal_gradient_bin():
    img = np.zeros((16, 16, 3), np.uint8)
    img[:, 8:] = 255                                          # vertical edge: gradient along x
    hog = build_extractor("hog", bins=9, cell=8)(img[None]).astype(float)
    assert hog.shape == (9, 2, 2)
    assert hog[:, :, :].sum(axis=(1, 2)).argmax() == 0


def test_rgb_is_the_middle_frame():
    frames = np.stack([np.full((4, 4, 3), i, np.uint8) for i in range(5)])
    assert np.all(build_extractor("rgb")(frames) == 2)


class _MeanBrightness:
    name = "brightness"

    def __init__(self, **_):
        pass

    @staticmethod
    def frames_needed(stack):
        return 1

    def __call__(self, frames):
        return np.array([frames.mean()], np.float32)


def test_outside_code_registers_an_extractor_with_one_line(monkeypatch):
    import sys
    import types

    mod = types.ModuleType("my_video_features")
    mod.MeanBrightness = _MeanBrightness
    monkeypatch.setitem(sys.modules, "my_video_features", mod)
    register("brightness", "my_video_features:MeanBrightness")
    try:
        out = build_extractor("brightness")(np.full((2, 4, 4, 3), 10, np.uint8))
        assert out.tolist() == [10.0]
    finally:
        extractors.EXTRACTORS.pop("brightness")
    with pytest.raises(KeyError):
        build_extractor("brightness")


USER_MODULE = "tests.fixtures.user_extractors.motion_mask"


def test_validation_reads_the_registry_after_importing_extractor_modules(compose, monkeypatch):
    import sys

    import workloads.video as video
    from orchard import ConfigError

    monkeypatch.delitem(sys.modules, USER_MODULE, raising=False)
    monkeypatch.delitem(extractors.EXTRACTORS, "motion_mask", raising=False)
    with pytest.raises(ConfigError) as err:                      # not registered: refused, with the key
        video.validate(compose("workload=video", "video.streams.temporal=motion_mask"))
    assert err.value.key == "video.streams.temporal"
    with pytest.raises(ConfigError) as err:
        video.validate(compose("workload=video", "video.extractor_modules=[no_such_pkg.features]"))
    assert err.value.key == "video.extractor_modules"
    video.validate(compose("workload=video", "video.streams.temporal=motion_mask",
                           f"video.extractor_modules=[{USER_MODULE}]"))
    assert "motion_mask" in extractors.EXTRACTORS


def test_a_user_extractor_runs_in_the_ray_data_actors(ray_session, tiny_videos):
    """The stage actors never imported the user's module: ``extractor_modules`` does it there."""
    from workloads.video.pipeline import build_dataset, collect

    from .conftest import pipeline_config

    _, index = tiny_videos
    segs = [{"video": v, "label": index.labels[v], "offset": 1, "count": 5} for v in range(4)]
    ds = build_dataset(segs, ["rgb", "motion_mask"], index.paths, index.lengths,
                       pipeline_config(extractor_modules=[USER_MODULE]), pts=index.pts, digests=index.digests)
    feats, meta = collect(ds, "motion_mask", ("video",))
    assert feats.shape == (4, 4, 32, 32) and set(np.unique(feats)) <= {0, 255}
    assert (feats == 255).any()                                   # the synthetic videos move
