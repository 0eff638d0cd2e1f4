"""Video decoders: exact frames at an offset, behind a small interface.

The notes' decode worker "gets required video, offset and video window width,
delivers corresponding frames". A decoder is any object with
``decode(path, offset, count) -> uint8 (count, H, W, 3)`` and ``probe(path) -> int``
(frame count); PyAV is the default and the only one required. Register another one
(decord, torchcodec) in ``DECODERS`` as ``name -> "module:Class"``.
"""
from __future__ import annotations

import contextlib
import importlib

import cv2
import numpy as np

DECODERS = {"pyav": "workloads.video.decoder:PyAVDecoder"}
SHORT_RULES = ("loop", "pad")


class BadVideo(Exception):
    """A file that is not a decodable video (corrupt, truncated, empty, not video)."""


def build_decoder(name: str, **kwargs):
    """Instantiate the decoder registered under ``name``."""
    module, cls = DECODERS[name].split(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)


def wanted_indices(offset: int, count: int, length: int, short_rule: str) -> list[int]:
    """Frame indices to deliver for a request; handles requests past the end.

    ``loop`` wraps around to frame 0 (the video plays again, motion keeps its
    direction except at the seam); ``pad`` repeats the last frame (motion stops).
    We default to loop because a repeated frame produces zero flow, which for a
    temporal stream looks like a different, "static" class.
    """
    if length <= 0:
        raise BadVideo("video has no frames")
    idx = np.arange(offset, offset + count)
    if short_rule == "loop":
        idx = idx % length
    elif short_rule == "pad":
        idx = np.minimum(idx, length - 1)
    else:
        raise ValueError(f"short_rule must be one of {SHORT_RULES}")
    return idx.tolist()


class PyAVDecoder:
    """Decode exact frames with PyAV: seek to the keyframe before ``offset``, decode forward.

    Frame indices come from presentation timestamps (pts * time_base * fps), so a
    seek that lands on an earlier keyframe is corrected by skipping frames.
    """

    def __init__(self, size: int | None = None, short_rule: str = "loop", threads: int = 1):
        self.size = size
        self.short_rule = short_rule
        self.threads = threads

    @contextlib.contextmanager
    def _opened(self, path: str):
        """``(container, stream)`` for the block; any decode error inside becomes ``BadVideo``."""
        container, stream = self._open(path)
        try:
            yield container, stream
        except BadVideo:
            raise
        except Exception as exc:
            raise BadVideo(f"decode error: {type(exc).__name__}: {exc}") from exc
        finally:
            container.close()

    def _open(self, path: str):
        import av

        try:
            container = av.open(str(path), mode="r")
        except Exception as exc:  # av raises many InvalidDataError subclasses
            raise BadVideo(f"cannot open: {type(exc).__name__}: {exc}") from exc
        if not container.streams.video:
            container.close()
            raise BadVideo("no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "SLICE" if self.threads > 1 else "NONE"
        stream.codec_context.thread_count = self.threads
        return container, stream

    @staticmethod
    def _index_of(frame, stream, start_pts: int, fps: float) -> int:
        if frame.pts is None:
            return -1
        return int(round(float((frame.pts - start_pts) * stream.time_base) * fps))

    def _resize(self, rgb: np.ndarray) -> np.ndarray:
        if self.size is None or rgb.shape[0] == rgb.shape[1] == self.size:
            return rgb
        return cv2.resize(rgb, (self.size, self.size), interpolation=cv2.INTER_AREA)

    def probe(self, path: str) -> int:
        """Number of decodable frames; raises ``BadVideo`` for a file that is not one.

        Decodes every packet: a truncated file often opens and reports a frame
        count in its header but decodes fewer frames, which only decoding shows.
        """
        with self._opened(path) as (container, stream):
            stream.codec_context.skip_frame = "NONE"
            declared = stream.frames
            decoded = sum(1 for _ in container.decode(stream))
        if decoded == 0:
            raise BadVideo("no decodable frames")
        if declared and decoded < declared:
            raise BadVideo(f"truncated: decoded {decoded} of {declared} frames")
        return decoded

    def decode(self, path: str, offset: int, count: int, length: int | None = None) -> np.ndarray:
        """Frames ``offset .. offset+count-1`` as uint8 (count, H, W, 3) RGB.

        ``length`` (frames in the video, from the scan) applies the short-video rule;
        without it the request must lie inside the video.
        """
        want = wanted_indices(offset, count, length, self.short_rule) if length else \
            list(range(offset, offset + count))
        lo, hi = min(want), max(want)
        with self._opened(path) as (container, stream):
            fps = float(stream.average_rate or stream.guessed_rate or 25)
            start_pts = stream.start_time or 0
            found: dict[int, np.ndarray] = {}
            for attempt_seek in (lo > 0, False):
                if attempt_seek:
                    target = start_pts + int(lo / fps / stream.time_base)
                    container.seek(target, stream=stream, backward=True, any_frame=False)
                else:
                    container.seek(start_pts, stream=stream, backward=True, any_frame=False)
                first_index = None
                for frame in container.decode(stream):
                    i = self._index_of(frame, stream, start_pts, fps)
                    first_index = i if first_index is None else first_index
                    if lo <= i <= hi and i in want:
                        found[i] = self._resize(frame.to_ndarray(format="rgb24"))
                    if i >= hi:
                        break
                # A seek that overshoots (some containers index keyframes loosely)
                # is retried once from the start.
                if first_index is not None and first_index <= lo:
                    break
        missing = [i for i in want if i not in found]
        if missing:
            raise BadVideo(f"frames {missing[:3]}... not in video")
        return np.stack([found[i] for i in want])

    def decode_all(self, path: str) -> np.ndarray:
        """Every frame, sequentially, uint8 (T, H, W, 3); the reference for exactness."""
        with self._opened(path) as (container, stream):
            return np.stack([self._resize(f.to_ndarray(format="rgb24")) for f in container.decode(stream)])
