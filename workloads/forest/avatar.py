"""Synthetic articulated avatar rendered to depth + body-part labels (2.1's training corpus).

The paper trains on depth/label PNG pairs synthesised from a motion-captured avatar.
With no such corpus at hand we build a small one: a skeleton in a random pose, shape,
yaw and distance, whose limbs are capsules (swept spheres), head and torso unions of
spheres, each sphere carrying one of the 31 part labels (`body_parts.py`). A numba
z-buffer ray-casts the spheres through a pinhole camera; depth is in millimetres, 0
where nothing was hit (a Kinect "no reading"). `render_dataset` renders in parallel
Ray tasks and writes the real PNG format, so synthetic and real data share one loader.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .body_parts import BACKGROUND, PART_INDEX as P
from .jit import njit

# Kinect-like camera: 57 degree horizontal field of view.
HORIZONTAL_FOV_DEG = 57.0


def focal_length_px(width: int) -> float:
    """Pinhole focal length (pixels) of a `width`-pixel image with a 57 degree FOV."""
    return 0.5 * width / math.tan(math.radians(HORIZONTAL_FOV_DEG / 2))


def _rotate(v: np.ndarray, axis: np.ndarray, angle: float) -> np.ndarray:
    """Rodrigues rotation of vector(s) `v` (..., 3) about unit `axis` by `angle` radians."""
    axis = axis / np.linalg.norm(axis)
    c, s = math.cos(angle), math.sin(angle)
    return v * c + np.cross(axis, v) * s + np.outer(v @ axis, axis).reshape(v.shape) * (1 - c)


class _Body:
    """Accumulates (centre, radius, label) spheres in the body frame
    (X = person's left, Y = up, Z = out of the chest), metres."""

    def __init__(self):
        self.centres, self.radii, self.labels = [], [], []

    def sphere(self, c, r, label):
        self.centres.append(np.asarray(c, float)); self.radii.append(r); self.labels.append(label)

    def capsule(self, a, b, r, label):
        a, b = np.asarray(a, float), np.asarray(b, float)
        n = max(2, int(math.ceil(np.linalg.norm(b - a) / (0.4 * r))) + 1)
        for t in np.linspace(0.0, 1.0, n):
            self.sphere(a + t * (b - a), r, label)


def random_avatar(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random person in camera coordinates (x right, y down, z forward, metres).

    Returns centres (S, 3) float64, radii (S,) float64, labels (S,) uint8.
    Randomised: height 1.4-1.95 m, girth, arm/leg/torso/head pose, yaw +-45 deg,
    distance 1.8-4.0 m, lateral offset, camera height.
    """
    s = rng.uniform(1.4, 1.95) / 1.75          # height scale
    g = rng.uniform(0.85, 1.25)                # girth scale
    body = _Body()
    X, Y, Z = np.eye(3)
    pelvis = np.array([0.0, 0.95 * s, 0.0])
    # Upper body leans about the pelvis; build it upright then rotate.
    upper = _Body()
    for yy in np.arange(1.0, 1.43, 0.07) * s:
        upper_half = yy >= 1.2 * s
        for xx in (-0.12, -0.04, 0.04, 0.12):
            left = xx > 0
            name = ("L" if left else "R") + ("U" if upper_half else "W") + "_torso"
            upper.sphere([xx * s * g, yy, 0.0], 0.085 * s * g, P[name])
    neck_base, head_c = np.array([0, 1.45 * s, 0]), np.array([0, 1.63 * s, 0.01])
    upper.capsule(neck_base, [0, 1.53 * s, 0], 0.05 * s * g, P["neck"])
    head_tilt = rng.normal(0.0, 0.2)
    for dx in (-1, 1):
        for dy in (-1, 1):
            off = _rotate(np.array([dx * 0.04, dy * 0.04, 0.0]) * s, X, head_tilt)
            name = ("L" if dx > 0 else "R") + ("U" if dy > 0 else "W") + "_head"
            upper.sphere(head_c + off, 0.075 * s, P[name])
    for side, sign in (("L", 1.0), ("R", -1.0)):
        shoulder = np.array([sign * 0.2 * s * g, 1.41 * s, 0.0])
        flex = rng.uniform(-0.8, 2.8)           # forward swing of the upper arm
        abduct = rng.uniform(0.0, 1.6)          # sideways lift
        elbow_bend = rng.uniform(0.0, 2.3)
        upper_dir = _rotate(_rotate(-Y, X, -flex), Z, sign * abduct)
        elbow = shoulder + 0.29 * s * upper_dir
        bend_axis = np.cross(upper_dir, Z * 1.0 + 1e-3 * X)
        bend_axis = bend_axis if np.linalg.norm(bend_axis) > 1e-6 else X
        fore_dir = _rotate(upper_dir, bend_axis, sign * elbow_bend)
        wrist = elbow + 0.25 * s * fore_dir
        hand = wrist + 0.09 * s * fore_dir
        upper.sphere(shoulder, 0.065 * s * g, P[f"{side}_shoulder"])
        upper.capsule(shoulder + 0.06 * s * upper_dir, elbow - 0.04 * s * upper_dir,
                      0.048 * s * g, P[f"{side}U_arm"])
        upper.sphere(elbow, 0.05 * s * g, P[f"{side}_elbow"])
        upper.capsule(elbow + 0.04 * s * fore_dir, wrist - 0.025 * s * fore_dir,
                      0.04 * s * g, P[f"{side}W_arm"])
        upper.sphere(wrist, 0.035 * s * g, P[f"{side}_wrist"])
        upper.capsule(wrist + 0.03 * s * fore_dir, hand, 0.04 * s, P[f"{side}_hand"])
    lean = rng.normal(0.0, 0.12)
    for c, r, lab in zip(upper.centres, upper.radii, upper.labels):
        body.sphere(pelvis + _rotate(c - pelvis, X, lean), r, lab)
    for side, sign in (("L", 1.0), ("R", -1.0)):
        hip = np.array([sign * 0.09 * s * g, 0.93 * s, 0.0])
        flex = rng.uniform(-0.4, 1.3)
        abduct = rng.uniform(0.0, 0.5)
        knee_bend = rng.uniform(0.0, 1.0) * max(flex + 0.3, 0.2)
        thigh_dir = _rotate(_rotate(-Y, X, -flex), Z, sign * abduct)
        knee = hip + 0.44 * s * thigh_dir
        shin_dir = _rotate(thigh_dir, X, knee_bend)
        ankle = knee + 0.42 * s * shin_dir
        foot_dir = _rotate(Z, X, knee_bend - flex)
        body.capsule(hip, knee - 0.05 * s * thigh_dir, 0.075 * s * g, P[f"{side}U_leg"])
        body.sphere(knee, 0.06 * s * g, P[f"{side}_knee"])
        body.capsule(knee + 0.05 * s * shin_dir, ankle - 0.03 * s * shin_dir,
                     0.055 * s * g, P[f"{side}W_leg"])
        body.sphere(ankle, 0.045 * s, P[f"{side}_ankle"])
        body.capsule(ankle + 0.03 * s * foot_dir, ankle + 0.16 * s * foot_dir,
                     0.04 * s, P[f"{side}_foot"])
    centres = np.array(body.centres)
    centres[:, 1] -= centres[:, 1].min() - 0.045 * s  # stand on the floor (y = 0)
    centres = _rotate(centres, Y, rng.uniform(-0.8, 0.8))  # yaw about the vertical axis
    distance = rng.uniform(1.8, 4.0)
    camera_height = rng.uniform(0.8, 1.2)
    lateral = rng.uniform(-0.35, 0.35) * distance
    # body frame -> camera frame: the person faces the camera, so their left (+X)
    # is the image's right (+x), up is -y and the chest points at the camera (-z).
    cam = np.stack([centres[:, 0] + lateral, camera_height - centres[:, 1],
                    distance - centres[:, 2]], axis=1)
    return cam, np.array(body.radii), np.array(body.labels, dtype=np.uint8)


@njit(cache=True)
def render_spheres(centres, radii, labels, height, width, focal):
    """Z-buffer ray-cast of spheres through a pinhole camera centred on the image.

    centres (S, 3) metres in camera coordinates, radii (S,), labels (S,) uint8.
    Returns depth (height, width) uint16 millimetres (0 = nothing hit) and labels
    (height, width) uint8 (BACKGROUND where nothing was hit).
    """
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    zbuf = np.zeros((height, width), np.float64)
    out_labels = np.full((height, width), BACKGROUND, np.uint8)
    for s in range(centres.shape[0]):
        X, Y, Z, r = centres[s, 0], centres[s, 1], centres[s, 2], radii[s]
        if Z - r < 0.2:
            continue
        near = Z - r
        u0 = int(math.floor(focal * min((X - r) / near, (X - r) / (Z + r)) + cx))
        u1 = int(math.ceil(focal * max((X + r) / near, (X + r) / (Z + r)) + cx))
        v0 = int(math.floor(focal * min((Y - r) / near, (Y - r) / (Z + r)) + cy))
        v1 = int(math.ceil(focal * max((Y + r) / near, (Y + r) / (Z + r)) + cy))
        for v in range(max(v0, 0), min(v1, height - 1) + 1):
            dy = (v - cy) / focal
            for u in range(max(u0, 0), min(u1, width - 1) + 1):
                dx = (u - cx) / focal
                # |t d - C|^2 = r^2 with d = (dx, dy, 1): t is the hit's z (depth).
                a = dx * dx + dy * dy + 1.0
                b = -2.0 * (dx * X + dy * Y + Z)
                c = X * X + Y * Y + Z * Z - r * r
                disc = b * b - 4.0 * a * c
                if disc < 0.0:
                    continue
                t = (-b - math.sqrt(disc)) / (2.0 * a)
                if t > 0.0 and (zbuf[v, u] == 0.0 or t < zbuf[v, u]):
                    zbuf[v, u] = t
                    out_labels[v, u] = labels[s]
    depth = np.zeros((height, width), np.uint16)
    for v in range(height):
        for u in range(width):
            if zbuf[v, u] > 0.0:
                depth[v, u] = min(int(zbuf[v, u] * 1000.0 + 0.5), 65535)
    return depth, out_labels


def render_avatar_image(seed_seq, height: int, width: int):
    """Render one random person: (depth uint16 mm, labels uint8), both (height, width)."""
    rng = np.random.default_rng(seed_seq)
    centres, radii, labels = random_avatar(rng)
    return render_spheres(centres, radii, labels, height, width, focal_length_px(width))


def _in_storage(folder) -> bool:
    """An ``orchard.storage.Storage`` folder rather than a local path (a ``Path`` has
    ``write_bytes`` too, so the type decides, not the method)."""
    import os

    return not isinstance(folder, (str, os.PathLike))


def _render_chunk(out_dir: str, indices: list[int], seed: int, split: int,
                  height: int, width: int, palette: np.ndarray) -> int:
    from .depth_png import write_pair  # worker side import keeps cv2 out of the driver path
    if _in_storage(out_dir):  # an orchard.storage.Storage: render here, publish there
        import tempfile

        with tempfile.TemporaryDirectory(prefix="orchard-render-") as tmp:
            for i in indices:
                depth, labels = render_avatar_image([seed, split, i], height, width)
                write_pair(Path(tmp) / f"{i:06d}", depth, labels, palette)
            for png in sorted(Path(tmp).iterdir()):
                out_dir.write_bytes(png.name, png.read_bytes())
        return len(indices)
    for i in indices:
        depth, labels = render_avatar_image([seed, split, i], height, width)
        write_pair(Path(out_dir) / f"{i:06d}", depth, labels, palette)
    return len(indices)


def render_dataset(out_dir: Path, count: int, seed: int, split: int, height: int,
                   width: int, palette: np.ndarray, parallelism: int) -> list[Path]:
    """Render `count` single-person PNG pairs into `out_dir` with `parallelism` Ray tasks.

    Image i is a pure function of (seed, split, i), so re-rendering (e.g. on resume)
    reproduces the same corpus. Returns the sorted list of pair stems.
    """
    import ray

    remote = _in_storage(out_dir)  # a folder in the run storage (s3://...): stems are URIs
    if not remote:
        out_dir.mkdir(parents=True, exist_ok=True)
    render = ray.remote(num_cpus=1)(_render_chunk)
    chunks = [list(range(count))[k::parallelism] for k in range(parallelism)]
    ray.get([render.remote(out_dir if remote else str(out_dir), c, seed, split, height, width, palette)
             for c in chunks if c])
    if remote:
        return [f"{out_dir.uri}/{i:06d}" for i in range(count)]
    return [out_dir / f"{i:06d}" for i in range(count)]
