"""The real data format of 2.1 and the paper's preprocessing.

A scene is a pair of PNGs: `<stem>_depth.png`, 16-bit single channel, depth in
millimetres (0 = no reading), and `<stem>_labels.png`, 8-bit RGB whose colours encode
the body part of each pixel through a palette (config `forest.palette`: 31 part
colours then the background colour). Preprocessing (2.1): flip on the vertical axis
(swapping left/right parts), compose several single-person images into one,
background clutter (walls, couches), depth-camera noise.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .body_parts import BACKGROUND, LEFT_RIGHT_SWAP, NUM_PARTS


def palette_array(palette_hex: list[str]) -> np.ndarray:
    """Palette of '#rrggbb' strings -> (32, 3) uint8 RGB; entry 31 is the background."""
    if len(palette_hex) != NUM_PARTS + 1:
        raise ValueError(f"palette needs {NUM_PARTS + 1} colours, got {len(palette_hex)}")
    rgb = np.array([[int(h.lstrip("#")[k:k + 2], 16) for k in (0, 2, 4)] for h in palette_hex],
                   dtype=np.uint8)
    if len({tuple(c) for c in rgb}) != len(rgb):
        raise ValueError("palette colours must be distinct")
    return rgb


def write_pair(stem: Path, depth_mm: np.ndarray, labels: np.ndarray, palette: np.ndarray) -> None:
    """Write depth (H, W) uint16 mm and labels (H, W) uint8 as the two PNGs of `stem`."""
    stem = Path(stem)
    if depth_mm.dtype != np.uint16:
        raise TypeError(f"depth must be uint16 millimetres, got {depth_mm.dtype}")
    rgb = palette[labels]
    if not cv2.imwrite(f"{stem}_depth.png", depth_mm):
        raise OSError(f"could not write {stem}_depth.png")
    if not cv2.imwrite(f"{stem}_labels.png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
        raise OSError(f"could not write {stem}_labels.png")


class BadPair(ValueError):
    """A PNG pair that cannot be used; ``kind`` is the key of ``data/skipped_files/<kind>``
    (orchard/tracking/skipped.py): missing, unreadable, not_depth, size_mismatch, off_palette."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


def read_pair(stem: Path, palette: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Read a PNG pair: depth (H, W) uint16 mm, labels (H, W) uint8 in 0..31.

    Raises BadPair (a ValueError with a kind) on a missing or undecodable file, a depth image
    that is not 16-bit single channel, a size mismatch, or a label colour not in the palette.
    """
    depth = cv2.imread(f"{stem}_depth.png", cv2.IMREAD_UNCHANGED)
    bgr = cv2.imread(f"{stem}_labels.png", cv2.IMREAD_COLOR)
    if depth is None or bgr is None:
        gone = [p for p in (f"{stem}_depth.png", f"{stem}_labels.png") if not Path(p).is_file()]
        raise BadPair("missing" if gone else "unreadable",
                      f"{Path(gone[0]).name} is missing" if gone
                      else f"unreadable PNG pair {stem}_depth.png / _labels.png (corrupt or truncated)")
    if depth.dtype != np.uint16 or depth.ndim != 2:
        raise BadPair("not_depth", f"{stem}_depth.png: expected 16-bit single-channel depth, "
                      f"got {depth.dtype} with shape {depth.shape}")
    if bgr.shape[:2] != depth.shape:
        raise BadPair("size_mismatch", f"{stem}: label image {bgr.shape[:2]} != depth image {depth.shape}")
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB).astype(np.int32)
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    keys = (palette[:, 0].astype(np.int32) << 16) | (palette[:, 1].astype(np.int32) << 8) \
        | palette[:, 2].astype(np.int32)
    order = np.argsort(keys)
    pos = np.clip(np.searchsorted(keys[order], packed), 0, len(keys) - 1)
    found = keys[order][pos] == packed
    if not found.all():
        bad = rgb[~found][0]
        raise BadPair("off_palette", f"{stem}_labels.png: colour {tuple(bad)} is not in the palette")
    return depth, order[pos].astype(np.uint8)


def flip(depth: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror on the vertical axis; a person's left becomes their right, so L/R labels swap."""
    return depth[:, ::-1].copy(), LEFT_RIGHT_SWAP[labels[:, ::-1]]


def compose(depth_a, labels_a, depth_b, labels_b, shift_px: int):
    """Compose two single-person scenes: B shifted `shift_px` right, nearer surface wins."""
    shifted_d = np.zeros_like(depth_b)
    shifted_l = np.full_like(labels_b, BACKGROUND)
    w = depth_b.shape[1]
    src = slice(max(0, -shift_px), min(w, w - shift_px))
    dst = slice(max(0, shift_px), min(w, w + shift_px))
    shifted_d[:, dst], shifted_l[:, dst] = depth_b[:, src], labels_b[:, src]
    take_b = (shifted_d > 0) & ((depth_a == 0) | (shifted_d < depth_a))
    return np.where(take_b, shifted_d, depth_a), np.where(take_b, shifted_l, labels_a)


def add_clutter(depth, labels, rng: np.random.Generator, max_objects: int):
    """Background clutter: a far wall and up to `max_objects` couch-like boxes.

    Clutter is written only where it is nearer than what is there (or where there was
    no reading) and is labelled BACKGROUND; it never occludes the person because it is
    placed at least 0.3 m behind the nearest body point.
    """
    depth, labels = depth.copy(), labels.copy()
    h, w = depth.shape
    body = labels != BACKGROUND
    behind = int(depth[body].max()) + 300 if body.any() else 2500
    wall_mm = behind + int(rng.uniform(200, 2000))
    ramp = np.linspace(-1, 1, w)[None, :] * rng.uniform(-400, 400)  # wall at an angle
    wall = np.clip(wall_mm + ramp, 500, 65000).astype(np.uint16) * np.ones((h, 1), np.uint16)
    for _ in range(int(rng.integers(0, max_objects + 1))):
        y0, x0 = int(rng.integers(h // 3, h)), int(rng.integers(0, w))
        y1, x1 = min(h, y0 + int(rng.integers(h // 8, h // 2))), min(w, x0 + int(rng.integers(w // 8, w // 2)))
        wall[y0:y1, x0:x1] = np.minimum(wall[y0:y1, x0:x1], behind + int(rng.uniform(0, 800)))
    fill = ~body & ((depth == 0) | (wall < depth))
    depth[fill] = wall[fill]
    labels[fill] = BACKGROUND
    return depth, labels


def add_noise(depth, rng: np.random.Generator, sigma_mm_at_1m: float, dropout: float):
    """Depth-camera noise: Gaussian with sigma growing with depth squared (structured-light
    disparity noise), rounded to mm, plus `dropout` fraction of pixels with no reading."""
    z = depth.astype(np.float64)
    noisy = z + rng.normal(0.0, 1.0, z.shape) * sigma_mm_at_1m * (z / 1000.0) ** 2
    noisy = np.where(depth > 0, np.clip(np.rint(noisy), 1, 65535), 0)
    noisy[rng.random(z.shape) < dropout] = 0
    return noisy.astype(np.uint16)


def preprocess(depth, labels, rng: np.random.Generator, settings: dict, partner=None):
    """The paper's random transformations in order: compose (with `partner`, another
    (depth, labels) pair, if given), flip, clutter, noise. `settings` is
    `forest.preprocess`. Returns (depth uint16 mm, labels uint8)."""
    if partner is not None:
        w = depth.shape[1]
        shift = int(rng.integers(w // 4, w // 2)) * (1 if rng.random() < 0.5 else -1)
        depth, labels = compose(depth, labels, partner[0], partner[1], shift)
    if rng.random() < settings["flip_prob"]:
        depth, labels = flip(depth, labels)
    if rng.random() < settings["clutter_prob"]:
        depth, labels = add_clutter(depth, labels, rng, settings["clutter_objects"])
    if settings["noise_sigma_mm"] > 0 or settings["dropout"] > 0:
        depth = add_noise(depth, rng, settings["noise_sigma_mm"], settings["dropout"])
    return depth, labels


def pair_stems(folder) -> list[Path]:
    """Stems of the `<stem>_depth.png` files of `folder`, in name order."""
    return sorted(p.with_name(p.name[:-len("_depth.png")]) for p in Path(folder).expanduser().glob("*_depth.png"))


def first_usable_pair(stems: list[Path], palette: np.ndarray) -> tuple[Path | None, list[str]]:
    """Scan pairs in order up to the first one that reads and shows a body pixel with a depth
    reading. Returns (that stem or None, why each pair before it was not usable)."""
    problems = []
    for stem in stems:
        try:
            depth, labels = read_pair(stem, palette)
        except (OSError, ValueError) as exc:
            problems.append(f"{Path(stem).name}: {str(exc).splitlines()[0][:120]}")
            continue
        if ((labels != BACKGROUND) & (depth > 0)).any():
            return stem, problems
        problems.append(f"{Path(stem).name}: no body pixel with a depth reading")
    return None, problems
