"""Video decoders: exact frames at an offset, behind a small interface.

The notes' decode worker "gets required video, offset and video window width,
delivers corresponding frames". A decoder is any object with
``decode(path, offset, count, length=None, pts=None) -> uint8 (count, H, W, 3)``,
``index(path) -> int64 (T,)`` (the presentation timestamp of every frame) and
``probe(path) -> int`` (frame count); PyAV is the default and the only one required.
Register another one (decord, torchcodec) in ``DECODERS`` as ``name -> "module:Class"``.

Frame k is the k-th *presented* frame. A frame's index is never computed from its
timestamp and an average frame rate (wrong on variable-frame-rate files, GROUND.md):
``index`` decodes the file once, in order, and keeps the pts of every frame; ``decode``
seeks to the keyframe before the first wanted pts and matches frames by pts.
"""
from __future__ import annotations

import contextlib
import importlib

import numpy as np

DECODERS = {"pyav": "workloads.video.decoder:PyAVDecoder"}
SHORT_RULES = ("loop", "pad")
# files a decoder keeps open between clips (each holds a demuxer and a decoder)... Blocks draw
# clips across the whole dataset, so a small one is a cycle over every file, which an LRU smaller
# than the cycle misses at every open: with 16 the bench's 24 files were reopened each block (7% of
# the actor's time in _open, 2.5-2.8 vs 2.4-2.5 ms of CPU a clip with 64)
KEEP_OPEN = 64
KEEP_OPEN_PIXELS = 4 * 1920 * 1080   # ...and frames of at most this many pixels in all (a decoder
                                     # holds a few reference frames: ~4 open 1080p files, ~9 at 720p)
JOIN_GAP = 16      # wanted frames this close are decoded through rather than reached by a new seek
# why a file is not a usable video: the keys of data/skipped_files/<kind> in MLflow (orchard/tracking/skipped.py)
SKIP_KINDS = ("missing", "empty", "unreadable", "image", "audio_only", "no_video_stream", "single_frame",
              "no_frames", "truncated", "corrupt", "outside_folder")  # the last: orchard.tracking.skipped.LeavesFolder
# containers and codecs that hold still images (a .jpg in a class folder opens as a 1-frame "video")
_IMAGE_FORMATS = ("image2", "jpeg_pipe", "png_pipe", "bmp_pipe", "webp_pipe", "tiff_pipe", "gif_pipe",
                  "pgm_pipe", "ppm_pipe", "qoi_pipe", "j2k_pipe", "svg_pipe")
_IMAGE_CODECS = ("mjpeg", "png", "bmp", "webp", "tiff", "jpeg2000", "pgm", "ppm", "qoi")


def local_video(path: str) -> str:
    """A video as a file on *this* node: a local path as it is; a storage URI (``s3://...``, the
    run's ``storage.uri``) copied once into the node cache (``Storage.local_copy``), since FFmpeg
    opens files. Decode stages on any node read videos this way, never by a driver's path."""
    from orchard.api import Storage, is_uri

    if not is_uri(path):
        return str(path)
    folder, _, name = str(path).rpartition("/")
    return str(Storage(folder).local_copy(name))


def file_stat(path: str) -> tuple[int, int] | None:
    """``(size in bytes, mtime in ns)`` of a local path or a storage URI; None when it is absent."""
    from orchard.api import is_uri

    if not is_uri(path):
        import os

        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns) if os.path.isfile(path) else None
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(str(path))
    info = fs.get_file_info(inner)
    if info.type != pafs.FileType.File:
        return None
    return int(info.size), int(info.mtime_ns or 0)


class BadVideo(Exception):
    """A file that is not a decodable video; ``kind`` is one of ``SKIP_KINDS``."""

    def __init__(self, message: str, kind: str = "corrupt"):
        super().__init__(message)
        self.kind = kind


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
        raise BadVideo("video has no frames", "no_frames")
    idx = np.arange(offset, offset + count)
    if short_rule == "loop":
        idx = idx % length
    elif short_rule == "pad":
        idx = np.minimum(idx, length - 1)
    else:
        raise ValueError(f"short_rule must be one of {SHORT_RULES}")
    return idx.tolist()


def looks_like_video(path: str) -> str:
    """A quick header check (no decoding): ``""`` for a plausible video, else the skip kind.

    Used by the config check before Ray starts; the full check is ``PyAVDecoder.index``.
    """
    import os

    if not os.path.isfile(path):
        return "missing"
    if os.path.getsize(path) == 0:
        return "empty"
    import av

    try:
        container = av.open(str(path), mode="r")
    except Exception:
        return "unreadable"
    try:
        return _container_kind(container)
    finally:
        container.close()


def _container_kind(container) -> str:
    if not container.streams.video:
        return "audio_only" if container.streams.audio else "no_video_stream"
    stream = container.streams.video[0]
    if container.format.name in _IMAGE_FORMATS or (stream.codec_context.name in _IMAGE_CODECS
                                                   and (stream.frames or 0) <= 1 and not container.duration):
        return "image"
    return ""


class PyAVDecoder:
    """Decode exact frames with PyAV: seek to the keyframe before ``offset``, decode forward.

    Frames are matched to indices by their presentation timestamps against the
    file's frame index (``index``), so a seek that lands on an earlier keyframe is
    corrected by skipping frames, and VFR files give the same frames as a
    sequential decode.
    """

    def __init__(self, size: int | None = None, short_rule: str = "loop", threads: int = 1):
        self.size = size
        self.short_rule = short_rule
        self.threads = threads
        self._indices: dict[str, np.ndarray] = {}
        self._open_files: dict[str, tuple] = {}      # path -> (container, stream), oldest first
        self._reformatter = None                     # one swscale context for every frame (_rgb)

    @contextlib.contextmanager
    def _kept_open(self, path: str):
        """``_opened``, but the file stays open for the next call (the most recent files, up to
        ``KEEP_OPEN`` of them and ``KEEP_OPEN_PIXELS`` of frame): opening a file and starting its decoder cost about as much as decoding a short
        clip. A file that raised is closed and forgotten."""
        entry = self._open_files.pop(path, None)
        if entry is None:
            entry = self._open(path)
        try:
            yield entry
        except BadVideo:
            entry[0].close()
            raise
        except Exception as exc:
            entry[0].close()
            raise BadVideo(f"decode error: {type(exc).__name__}: {exc}", "corrupt") from exc
        self._open_files[path] = entry               # most recent last
        while len(self._open_files) > 1 and (len(self._open_files) > KEEP_OPEN
                                             or self._kept_pixels() > KEEP_OPEN_PIXELS):
            self._open_files.pop(next(iter(self._open_files)))[0].close()   # the oldest

    def _kept_pixels(self) -> int:
        return sum(stream.codec_context.width * stream.codec_context.height
                   for _, stream in self._open_files.values())

    def close(self) -> None:
        """Close the files kept open."""
        while self._open_files:
            self._open_files.popitem()[1][0].close()

    @contextlib.contextmanager
    def _opened(self, path: str):
        """``(container, stream)`` for the block; any decode error inside becomes ``BadVideo``."""
        container, stream = self._open(path)
        try:
            yield container, stream
        except BadVideo:
            raise
        except Exception as exc:
            raise BadVideo(f"decode error: {type(exc).__name__}: {exc}", "corrupt") from exc
        finally:
            container.close()

    def _open(self, path: str):
        import av

        try:
            container = av.open(local_video(path), mode="r")
        except Exception as exc:  # av raises many InvalidDataError subclasses
            raise BadVideo(f"cannot open: {type(exc).__name__}: {exc}", "unreadable") from exc
        kind = _container_kind(container)
        if kind:
            fmt = container.format.name
            container.close()
            raise BadVideo({"image": f"a still image ({fmt}), not a video",
                            "audio_only": "audio only: no video stream",
                            "no_video_stream": "no video stream"}[kind], kind)
        stream = container.streams.video[0]
        stream.thread_type = "SLICE" if self.threads > 1 else "NONE"
        stream.codec_context.thread_count = self.threads
        return container, stream

    def _rgb(self, frame) -> np.ndarray:
        """A decoded frame as uint8 (size, size, 3) RGB. A frame of another size is scaled by
        FFmpeg's swscale in the same call that converts it from YUV, averaging over areas as
        cv2's INTER_AREA does on the RGB frame (brightness within a grey level; fine colour detail,
        kept at half resolution in 4:2:0 video, differs more): on a 1280x720 frame 1.2 ms of CPU
        against 7.8 ms for converting the whole frame to RGB and resizing it with cv2.

        Through one ``VideoReformatter`` kept by the decoder, on the decoder's threads: a frame's
        own ``to_ndarray``/``reformat`` builds a new swscale context for that frame, with a thread
        per CPU since PyAV 17, which cost ~0.2 ms a 112x112 frame against ~0.01 ms here (docs/
        benchmarks/video.md). The pixels are the same."""
        if self._reformatter is None:
            from av.video.reformatter import VideoReformatter

            self._reformatter = VideoReformatter()
        scale = {} if self.size is None or frame.width == frame.height == self.size else \
            {"width": self.size, "height": self.size, "interpolation": "AREA"}
        return self._reformatter.reformat(frame, format="rgb24", threads=self.threads, **scale).to_ndarray()

    def index(self, path: str) -> np.ndarray:
        """The pts of every presented frame, int64 (T,), in presentation order; raises ``BadVideo``.

        Decodes every packet once (memoized per decoder; ``dataset.scan`` keeps it on
        disk): a truncated file often opens and reports a frame count in its header
        but decodes fewer frames, which only decoding shows. A frame without a pts
        gets -1; such a file is then decoded sequentially (``decode``).
        """
        path = str(path)
        if path in self._indices:
            return self._indices[path]
        with self._opened(path) as (container, stream):
            stream.codec_context.skip_frame = "NONE"
            declared = stream.frames
            pts = [-1 if f.pts is None else int(f.pts) for f in container.decode(stream)]
        if not pts:
            raise BadVideo("no decodable frames", "no_frames")
        if declared and len(pts) < declared:
            raise BadVideo(f"truncated: decoded {len(pts)} of {declared} frames", "truncated")
        if len(pts) == 1:
            raise BadVideo("a single frame: no motion to learn from", "single_frame")
        self._indices[path] = np.asarray(pts, np.int64)
        return self._indices[path]

    def probe(self, path: str) -> int:
        """Number of decodable frames; raises ``BadVideo`` for a file that is not a video."""
        return len(self.index(path))

    def decode(self, path: str, offset: int, count: int, length: int | None = None,
               pts: np.ndarray | None = None) -> np.ndarray:
        """Frames ``offset .. offset+count-1`` (presentation order) as uint8 (count, H, W, 3) RGB.

        ``length`` (frames in the video, from the scan) applies the short-video rule;
        without it the request must lie inside the video. ``pts`` is the file's frame
        index (``index``); without it the index is read (once per decoder and file).
        """
        return self.decode_many(path, [(offset, count)], length=length, pts=pts)[0]

    def decode_many(self, path: str, requests: list[tuple[int, int]], length: int | None = None,
                    pts: np.ndarray | None = None) -> list[np.ndarray]:
        """``decode`` for several ``(offset, count)`` clips of one file in one pass over it.

        The clips' frames are decoded once however they overlap, in presentation order: one seek
        per stretch of wanted frames (stretches closer than ``JOIN_GAP`` frames are decoded
        through, which costs less than a seek back to their keyframe), with the file kept open
        between calls (``KEEP_OPEN`` files per decoder), so the clips of one batch that share a
        video share its demuxer, its decoder's start and its keyframes' decoding.
        """
        pts = self.index(path) if pts is None else np.asarray(pts, np.int64)
        length = length or len(pts)
        wants = [wanted_indices(offset, count, length, self.short_rule) for offset, count in requests]
        found = self._decode_indices(path, pts, sorted(set().union(*wants)))
        return [np.stack([found[i] for i in want]) for want in wants]

    def _decode_indices(self, path: str, pts: np.ndarray, indices: list[int]) -> dict[int, np.ndarray]:
        """``{frame index: RGB frame}`` for the sorted ``indices``; raises ``BadVideo``."""
        by_pts = {int(p): i for i, p in enumerate(pts)}
        sequential = len(by_pts) < len(pts) or (pts < 0).any()   # missing or repeated pts: count frames
        stretches, found = [[indices[0], indices[-1]]] if sequential else [], {}
        if not sequential:
            for i in indices:
                if stretches and i - stretches[-1][1] <= JOIN_GAP:
                    stretches[-1][1] = i
                else:
                    stretches.append([i, i])
        wanted = set(indices)
        with self._kept_open(path) as (container, stream):
            for lo, hi in stretches:
                self._decode_stretch(container, stream, pts, by_pts, sequential, lo, hi, wanted, found)
            missing = [i for i in indices if i not in found]
            if missing:   # raised inside: a file that failed is not kept open
                raise BadVideo(f"frames {missing[:3]}... not in video", "truncated")
        return found

    def _decode_stretch(self, container, stream, pts, by_pts, sequential, lo, hi, wanted, found) -> None:
        """Decode frames ``lo..hi`` into ``found`` (the wanted ones): seek to the keyframe before
        ``lo`` and decode forward, matching frames by pts (by count on a file without them)."""
        for seek in ((lo > 0 and not sequential), False):
            target = int(pts[lo]) if seek else int(pts[0] if not sequential else (stream.start_time or 0))
            container.seek(target, stream=stream, backward=True, any_frame=False)
            first, got = None, {}
            for k, frame in enumerate(container.decode(stream)):
                i = k if sequential else by_pts.get(-1 if frame.pts is None else int(frame.pts), -1)
                first = i if first is None else first
                if i in wanted and lo <= i:
                    got[i] = self._rgb(frame)
                if i >= hi:
                    break
            # a seek that overshoots (a loosely indexed container) is retried once from the start
            if first is not None and 0 <= first <= lo:
                break
        found.update(got)

    def decode_all(self, path: str) -> np.ndarray:
        """Every frame, sequentially, uint8 (T, H, W, 3); the reference for exactness."""
        return np.stack(list(self.iter_frames(path)))

    def iter_frames(self, path: str):
        """Every frame, sequentially, one (H, W, 3) uint8 at a time: a long video never whole in memory."""
        with self._opened(path) as (container, stream):
            for f in container.decode(stream):
                yield self._rgb(f)
