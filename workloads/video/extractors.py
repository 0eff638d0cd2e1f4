"""Feature extractors: an open registration table, as the notes' "feature-image table".

An extractor is a small class with ``name``, ``frames_needed(stack)`` and
``__call__(frames uint8 (T, H, W, 3)) -> np.ndarray (C, H', W')``; each runs as its own
Ray Data stage with its own resources.

Outside code adds one without editing orchard, in either of two ways:

- a module that calls ``register("name", "my.module:MyExtractor")`` when imported, named in
  ``video.extractor_modules=[my.module]``: the config check, the driver and every Ray Data
  stage actor import the listed modules (``load_modules``) before they look a name up, so
  the registration reaches the processes where extraction runs;
- an installed package's entry point ``[project.entry-points."orchard.video_extractors"]
  name = "my.module:MyExtractor"``, read wherever the table is read.

An extractor may also define ``many(clips) -> (N, ...)``: a block's clips at once, the same
outputs as clip by clip, with the work they share done once (``extract_many`` calls it where it
exists). The flow stack has one: overlapping clips of one video in a block (a video's segments,
sliding inference windows) hold the same frame pairs, and each pair's flow is computed once.

Every output is uint8 where the feature allows it: the notes' transmission argument
(a 256x256 flow stack of L=10 is 1.25 MB as float, 4x less quantized).
"""
from __future__ import annotations

import hashlib
import importlib

import cv2
import numpy as np

EXTRACTORS: dict[str, str] = {
    "rgb": "workloads.video.extractors:RGBFrame",
    "framediff": "workloads.video.extractors:FrameDiffStack",
    "flow": "workloads.video.extractors:OpticalFlowStack",
    "hog": "workloads.video.extractors:HOGMap",
}
FLOW_METHODS = ("farneback", "dis_fast", "dis_medium")


ENTRY_POINT_GROUP = "orchard.video_extractors"


def register(name: str, target: str) -> None:
    """Register an extractor class ``"module:Class"`` under ``name``."""
    EXTRACTORS[name] = target


def load_modules(modules) -> None:
    """Import the modules of ``video.extractor_modules`` (each registers its extractors on import)."""
    for module in modules or ():
        importlib.import_module(str(module))


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    try:
        return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken installed distribution must not break the built-in table
        return {}


def available(modules=()) -> list[str]:
    """Every extractor name: built-in, registered by ``modules``, and from entry points."""
    load_modules(modules)
    return sorted({**_entry_points(), **EXTRACTORS})


def build_extractor(name: str, **options):
    """Instantiate the extractor registered under ``name`` (lazy import)."""
    if name not in EXTRACTORS:
        EXTRACTORS.update({k: v for k, v in _entry_points().items() if k not in EXTRACTORS})
    if name not in EXTRACTORS:
        raise KeyError(f"unknown extractor {name!r}; registered: {sorted(EXTRACTORS)}")
    module, cls = EXTRACTORS[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)


def extract_many(extractor, clips) -> np.ndarray:
    """Every clip's feature, stacked: through the extractor's ``many`` where it has one (the work a
    block's overlapping clips share done once), else clip by clip."""
    many = getattr(extractor, "many", None)
    return many(clips) if many is not None else np.stack([extractor(c) for c in clips])


def _gray(frames: np.ndarray) -> np.ndarray:
    return np.stack([cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames])


class RGBFrame:
    """The middle frame of the clip, uint8 (3, H, W): the spatial stream's input."""

    name = "rgb"

    def __init__(self, **_):
        pass

    @staticmethod
    def frames_needed(stack: int) -> int:
        return 1

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(frames[len(frames) // 2].transpose(2, 0, 1))


class FrameDiffStack:
    """L grayscale differences of consecutive frames, uint8 (L, H, W).

    Quantized as ``(d + 255) // 2`` so 128 means "no change" (the same centring
    the flow stack uses).
    """

    name = "framediff"

    def __init__(self, stack: int = 10, **_):
        self.stack = stack

    @staticmethod
    def frames_needed(stack: int) -> int:
        return stack + 1

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        gray = _gray(frames[: self.stack + 1]).astype(np.int16)
        diff = gray[1:] - gray[:-1]
        return ((diff + 255) // 2).astype(np.uint8)


class OpticalFlowStack:
    """L optical-flow fields of consecutive frames, uint8 (2L, H, W) as (x0, y0, x1, y1, ...).

    Quantized as the common practice of the two-stream / TSN code (dense_flow):
    clip each component to [-bound, bound] pixels and map linearly to [0, 255],
    so 127.5 means zero motion. ``dequantize`` inverts it.
    """

    name = "flow"

    def __init__(self, stack: int = 10, method: str = "dis_medium", bound: float = 20.0, **_):
        if method not in FLOW_METHODS:
            raise ValueError(f"flow method must be one of {FLOW_METHODS}")
        self.stack, self.method, self.bound = stack, method, float(bound)
        self._dis = None

    @staticmethod
    def frames_needed(stack: int) -> int:
        return stack + 1

    def _pair(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        if self.method == "farneback":
            return cv2.calcOpticalFlowFarneback(prev, nxt, None, pyr_scale=0.5, levels=3, winsize=15,
                                                iterations=3, poly_n=5, poly_sigma=1.2, flags=0)
        if self._dis is None:  # built lazily: cv2 objects do not pickle into Ray actors
            preset = cv2.DISOPTICAL_FLOW_PRESET_FAST if self.method == "dis_fast" \
                else cv2.DISOPTICAL_FLOW_PRESET_MEDIUM
            self._dis = cv2.DISOpticalFlow_create(preset)
        return self._dis.calc(prev, nxt, None)

    def flow_fields(self, frames: np.ndarray) -> np.ndarray:
        """Unquantized flow, float32 (L, H, W, 2) in pixels per frame."""
        gray = _gray(frames[: self.stack + 1])
        return np.stack([self._pair(gray[i], gray[i + 1]) for i in range(self.stack)])

    def quantize(self, flow: np.ndarray) -> np.ndarray:
        scaled = (np.clip(flow, -self.bound, self.bound) + self.bound) * (255.0 / (2 * self.bound))
        return np.round(scaled).astype(np.uint8)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return q.astype(np.float32) * (2 * self.bound / 255.0) - self.bound

    def many(self, clips) -> np.ndarray:
        """The stacks of ``clips`` (each (T, H, W, 3)), (N, 2L, H, W): each distinct pair of
        consecutive frames gets one flow field however many clips hold it. Pairs are told apart by
        content (a 128-bit digest of both grey frames), so the stacks equal ``self(clip)`` clip by
        clip (DIS and Farneback start from zero flow: a pair's field depends on the pair alone)."""
        fields: dict[tuple[bytes, bytes], np.ndarray] = {}
        out = []
        for frames in clips:
            gray = _gray(frames[: self.stack + 1])
            keys = [hashlib.blake2b(g.tobytes(), digest_size=16).digest() for g in gray]
            stack = []
            for i in range(self.stack):
                pair = (keys[i], keys[i + 1])
                if pair not in fields:   # (H, W, 2) quantized as __call__ does, channels first: (x, y)
                    fields[pair] = self.quantize(self._pair(gray[i], gray[i + 1])).transpose(2, 0, 1)
                stack.append(fields[pair])
            out.append(np.concatenate(stack))
        return np.stack(out)

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        flow = self.flow_fields(frames)                    # (L, H, W, 2)
        q = self.quantize(flow).transpose(0, 3, 1, 2)      # (L, 2, H, W)
        return np.ascontiguousarray(q.reshape(-1, *q.shape[2:]))


class HOGMap:
    """Histogram of oriented gradients of the middle frame as a map, uint8 (bins, H/cell, W/cell).

    Per cell, unsigned orientations (0-180 deg) in ``bins`` bins weighted by
    gradient magnitude (Dalal & Triggs), L2-normalised per cell and scaled to 0-255
    so a CNN can take it as channels. Bin b covers [b, b+1) * 180/bins degrees of
    the gradient direction (a vertical edge has a horizontal gradient: bin 0).
    """

    name = "hog"

    def __init__(self, bins: int = 9, cell: int = 8, **_):
        self.bins, self.cell = bins, cell

    @staticmethod
    def frames_needed(stack: int) -> int:
        return 1

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        gray = cv2.cvtColor(frames[len(frames) // 2], cv2.COLOR_RGB2GRAY).astype(np.float32)
        gx = cv2.Sobel(gray, cv2.CV_32F, 1, 0, ksize=1)
        gy = cv2.Sobel(gray, cv2.CV_32F, 0, 1, ksize=1)
        mag, ang = cv2.cartToPolar(gx, gy, angleInDegrees=True)
        ang = ang % 180.0
        b = np.minimum((ang / (180.0 / self.bins)).astype(np.int64), self.bins - 1)
        h, w = gray.shape
        ch, cw = h // self.cell, w // self.cell
        cell_row = (np.arange(h) // self.cell)[:, None].clip(max=ch - 1)
        cell_col = (np.arange(w) // self.cell)[None, :].clip(max=cw - 1)
        flat = (b * ch + cell_row) * cw + cell_col
        hist = np.bincount(flat.ravel(), weights=mag.ravel(), minlength=self.bins * ch * cw)
        hist = hist.reshape(self.bins, ch, cw)
        hist /= np.sqrt((hist ** 2).sum(axis=0, keepdims=True)) + 1e-6
        return np.round(hist * 255).astype(np.uint8)


def output_shape(name: str, stack: int, size: int, **options) -> tuple[int, ...]:
    """The shape one clip's feature has, without computing it."""
    ext = build_extractor(name, stack=stack, **options)
    frames = np.zeros((ext.frames_needed(stack), size, size, 3), np.uint8)
    return ext(frames).shape
