"""Synthetic action videos: real H.264 MP4 files whose classes differ only in motion.

Every video draws its own appearance (background texture, patch texture, colours,
position) from its own seed, independently of its class, so one still frame says
(almost) nothing about the label; only the motion of the patch does. That is the
point of the design notes' two-stream argument: the temporal stream must matter.

Three knobs make the set harder, as real video is (all off by default here; the
default run's config turns them on so that its fusion table is informative):
``appearance_cue`` is the probability that a video's background carries its class's
colour tint (the scene context of real datasets: a pool for swimming), so the
spatial stream gets a partial, noisy cue; ``noise`` adds per-frame sensor noise
(grey levels, std) and ``shake`` a per-frame camera jitter (pixels, std), both of
which blur the optical flow the temporal stream relies on.

Layout written (UCF101 style): ``root/<class>/<class>_<i>.mp4``.
"""
from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

# Ordered so that the first N classes of any default size mix translation,
# rotation, zoom and blinking.
MOTION_CLASSES = (
    "move_right", "move_left", "rotate_cw", "rotate_ccw", "zoom_in", "blink",
    "zoom_out", "move_up", "move_down",
)


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A random low-frequency colour texture, uint8 (size, size, 3)."""
    coarse = rng.integers(0, 256, size=(max(2, size // 8), max(2, size // 8), 3), dtype=np.uint8)
    smooth = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC)
    fine = rng.integers(-25, 26, size=(size, size, 3))  # fine grain so flow has texture to track
    return np.clip(smooth.astype(np.int16) + fine, 0, 255).astype(np.uint8)


# Background tints (RGB gains), one per class in MOTION_CLASSES order.
_TINTS = np.array([[1.3, 0.8, 0.8], [0.8, 1.3, 0.8], [0.8, 0.8, 1.3], [1.25, 1.25, 0.7], [0.7, 1.25, 1.25],
                   [1.25, 0.7, 1.25], [1.1, 1.1, 1.1], [0.75, 0.75, 0.75], [1.3, 1.0, 0.6]])


class _Scene:
    """One video's appearance: a static background and a textured round patch."""

    def __init__(self, rng: np.random.Generator, size: int, cls: str | None = None,
                 appearance_cue: float = 0.0, noise: float = 0.0, shake: float = 0.0):
        self.size = size
        self.background = (_texture(rng, size) * 0.6).astype(np.uint8)
        self.patch_size = int(size * rng.uniform(0.4, 0.55))
        self.patch = _texture(rng, self.patch_size)
        yy, xx = np.mgrid[: self.patch_size, : self.patch_size]
        r = self.patch_size / 2
        self.patch_mask = ((yy - r + 0.5) ** 2 + (xx - r + 0.5) ** 2 <= r * r).astype(np.float32)
        self.center = rng.uniform(0.3, 0.7, size=2) * size  # (x, y) pixels
        self.speed = rng.uniform(1.5, 2.5)                  # pixels or degrees*2 per frame
        self.phase = rng.uniform(0, 1)
        self.blink_period = int(rng.integers(3, 6))
        # drawn after the appearance above, so clean videos (all knobs 0) stay as they were
        self.noise, self.shake, self.jitter_seed = noise, shake, int(rng.integers(2**31))
        if appearance_cue > 0:
            cued = cls in MOTION_CLASSES and rng.uniform() < appearance_cue
            tint = _TINTS[MOTION_CLASSES.index(cls)] if cued else _TINTS[rng.integers(len(_TINTS))]
            self.background = np.clip(self.background * tint, 0, 255).astype(np.uint8)

    def render(self, cls: str, t: int, camera_t: int | None = None) -> np.ndarray:
        """Frame ``t`` of motion class ``cls`` (or ``"static"``), uint8 (H, W, 3) RGB.

        ``camera_t``: the frame index for shake and noise when it differs from ``t``
        (an untrimmed video holding a pose while the camera keeps shaking).
        """
        cx, cy = self.center
        angle, scale, visible = 0.0, 1.0, True
        step = self.speed * t
        if cls == "move_right":
            cx += step
        elif cls == "move_left":
            cx -= step
        elif cls == "move_down":
            cy += step
        elif cls == "move_up":
            cy -= step
        elif cls == "rotate_cw":
            angle = -4.0 * step
        elif cls == "rotate_ccw":
            angle = 4.0 * step
        elif cls in ("zoom_in", "zoom_out"):
            # Sawtooth so the patch never leaves the frame: grows (or shrinks) for
            # 24 frames, then jumps back.
            ramp = (self.phase + t / 24.0) % 1.0
            scale = 0.6 + 0.8 * (ramp if cls == "zoom_in" else 1.0 - ramp)
        elif cls == "blink":
            visible = (t // self.blink_period) % 2 == 0
        elif cls != "static":
            raise ValueError(f"unknown motion class {cls!r}; known: {MOTION_CLASSES}")
        frame = self.background.copy()
        if visible:
            frame = self._draw_patch(frame, cx, cy, angle, scale)
        return self._camera(frame, t if camera_t is None else camera_t)

    def _camera(self, frame: np.ndarray, t: int) -> np.ndarray:
        """Camera shake and sensor noise of frame ``t`` (seeded per frame: renders are repeatable)."""
        if not (self.noise or self.shake):
            return frame
        rng = np.random.default_rng([self.jitter_seed, t])
        if self.shake:
            dx, dy = rng.normal(0, self.shake, size=2)
            frame = cv2.warpAffine(frame, np.float32([[1, 0, dx], [0, 1, dy]]), (self.size, self.size),
                                   flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
        if self.noise:
            frame = np.clip(frame + rng.normal(0, self.noise, frame.shape), 0, 255).astype(np.uint8)
        return frame

    def _draw_patch(self, frame: np.ndarray, cx: float, cy: float, angle: float, scale: float) -> np.ndarray:
        s = self.size
        cx, cy = cx % s, cy % s  # wrap around so long videos keep moving
        half = self.patch_size / 2
        warp = cv2.getRotationMatrix2D((half, half), angle, scale)
        warp[0, 2] += cx - half
        warp[1, 2] += cy - half
        # Draw at the wrapped position and its 8 torus neighbours so a patch that
        # crosses an edge reappears on the other side.
        for dx in (-s, 0, s):
            for dy in (-s, 0, s):
                shifted = warp.copy()
                shifted[0, 2] += dx
                shifted[1, 2] += dy
                patch = cv2.warpAffine(self.patch, shifted, (s, s), flags=cv2.INTER_LINEAR)
                mask = cv2.warpAffine(self.patch_mask, shifted, (s, s), flags=cv2.INTER_LINEAR)
                m = mask[..., None]
                frame = (frame * (1 - m) + patch * m).astype(np.uint8)
        return frame


# bumped whenever the same frames are written as other bytes (data.py names its folders by it):
# 2 = without x264's mbtree, on one encoder thread (the same bytes under any load, on any machine)
ENCODING = 2


def write_mp4(path: str | os.PathLike, frames: np.ndarray, fps: int = 25, codec: str = "libx264",
              gop: int = 16) -> None:
    """Encode uint8 frames (T, H, W, 3) RGB into a real video file (H, W even)."""
    import av

    t, h, w, _ = frames.shape
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        # A short GOP keeps seeks cheap (GROUND.md: ~2 ms at GOP 16 vs ~9 ms at 250).
        stream.codec_context.gop_size = gop
        if codec == "libx264":
            # the same frames, the same bytes, on any machine and under any load: x264's macroblock
            # tree (mbtree) gave other bytes, so other decoded pixels, for the same frames on a busy
            # machine (a run's figures moved with the load), and its output depends on its thread
            # count (the machine's cores by default). B-frames and the lookahead stay on.
            stream.options = {"crf": "18", "preset": "veryfast", "x264-params": "mbtree=0"}
            stream.codec_context.thread_count = 1
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def render_clip(cls: str, seed: int, size: int, num_frames: int, **difficulty: float) -> np.ndarray:
    """Render one trimmed action clip, uint8 (num_frames, size, size, 3).

    ``difficulty``: ``appearance_cue``, ``noise``, ``shake`` (module docstring).
    """
    scene = _Scene(np.random.default_rng(seed), size, cls, **difficulty)
    return np.stack([scene.render(cls, t) for t in range(num_frames)])


def generate_dataset(root: str | os.PathLike, num_classes: int, videos_per_class: int,
                     size: int = 64, num_frames: int = 40, seed: int = 0, fps: int = 25,
                     **difficulty: float) -> Path:
    """Write ``num_classes * videos_per_class`` MP4s under ``root/<class>/``; returns root.

    Idempotent: a file that already exists is kept, so a cached dataset is reused.
    """
    if not 1 <= num_classes <= len(MOTION_CLASSES):
        raise ValueError(f"num_classes must be in 1..{len(MOTION_CLASSES)}")
    root = Path(root)
    for c, cls in enumerate(MOTION_CLASSES[:num_classes]):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(videos_per_class):
            path = root / cls / f"{cls}_{i:03d}.mp4"
            if path.exists() and path.stat().st_size > 0:
                continue
            clip = render_clip(cls, seed * 1_000_003 + c * 10_007 + i, size, num_frames, **difficulty)
            tmp = path.with_suffix(".tmp.mp4")
            write_mp4(tmp, clip, fps=fps)
            tmp.rename(path)  # atomic: an interrupted run never leaves a half file
    return root


def generate_untrimmed(path: str | os.PathLike, cls: str, seed: int, size: int = 64,
                       background_frames: int = 30, action_frames: int = 30, fps: int = 25,
                       **difficulty: float) -> dict:
    """Write an untrimmed video: static background, the action, static background again.

    Returns ``{"path", "label", "action_start", "action_end"}`` (frame indices).
    """
    scene = _Scene(np.random.default_rng(seed), size, cls, **difficulty)
    # the background parts hold still, but the camera keeps shaking (camera frame index t)
    frames = []
    for t in range(2 * background_frames + action_frames):
        if t < background_frames:
            frames.append(scene.render("static", 0, camera_t=t))
        elif t < background_frames + action_frames:
            frames.append(scene.render(cls, t - background_frames, camera_t=t))
        elif cls == "blink":
            frames.append(scene.render("static", 0, camera_t=t))
        else:
            frames.append(scene.render(cls, action_frames - 1, camera_t=t))
    write_mp4(path, np.stack(frames), fps=fps)
    return {"path": str(path), "label": cls, "action_start": background_frames,
            "action_end": background_frames + action_frames}


# camera-like files at the sizes real footage comes in (a phone's QCIF, a letterboxed clip, HD),
# for the trainers' wait on mixed sizes (issue 51): name -> (width, height), pan in px per frame
MIXED_SIZES = {"qcif": ((176, 144), (3, 0)), "letterbox": ((640, 272), (1, 1)), "hd": ((1280, 720), (-3, 1))}


def write_mixed_footage(root: str | os.PathLike, copies: int = 4, num_frames: int = 100, seed: int = 7) -> Path:
    """Class folders of H.264 files at the ``MIXED_SIZES``: in each, ``copies`` copies of one pan over
    a textured picture with a moving disc, so decoding (a 1280x720 frame has 225 times the pixels of
    a 64x64 one), not learning, is what differs between the classes. Returns ``root``."""
    import shutil

    root, rng = Path(root), np.random.default_rng(seed)
    for name, ((w, h), (dx, dy)) in MIXED_SIZES.items():
        pad_w, pad_h = 3 * num_frames + 16, num_frames + 16
        big = (h + 2 * pad_h, w + 2 * pad_w)
        picture = _texture(rng, max(big))[:big[0], :big[1]]   # the synthetic clips' texture, wider
        frames = []
        for t in range(num_frames):
            x, y = pad_w + dx * t, pad_h + dy * t
            frame = picture[y:y + h, x:x + w].copy()
            cv2.circle(frame, (int(w / 2 + w / 4 * np.sin(t / 8)), h // 2), max(4, h // 8), (255, 200, 40), -1)
            frames.append(frame)
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        write_mp4(folder / f"{name}_0.mp4", np.stack(frames))
        for k in range(1, copies):
            shutil.copyfile(folder / f"{name}_0.mp4", folder / f"{name}_{k}.mp4")
    return root


def write_bad_files(folder: str | os.PathLike, good_video: str | os.PathLike) -> dict[str, str]:
    """Write the four kinds of bad file a real dataset holds next to good ones.

    Returns ``{kind: path}`` for kinds corrupt, truncated, zero_byte, not_video.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = Path(good_video).read_bytes()
    rng = np.random.default_rng(7)
    paths = {
        "corrupt": folder / "corrupt.mp4",
        "truncated": folder / "truncated.mp4",
        "zero_byte": folder / "zero_byte.mp4",
        "not_video": folder / "notes.txt",
    }
    paths["corrupt"].write_bytes(rng.integers(0, 256, size=len(data), dtype=np.uint8).tobytes())
    paths["truncated"].write_bytes(data[: len(data) // 2])
    paths["zero_byte"].write_bytes(b"")
    paths["not_video"].write_text("labels were checked by hand on 2026-11-02\n")
    return {k: str(v) for k, v in paths.items()}
