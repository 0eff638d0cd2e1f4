"""A synthetic canola field for when no annotated field images are at hand.

Writes exactly what the real loader (`data.py`, `tiles.py`) reads, so both paths run the same code:
    <out>/images/<name>.png        RGB field photographs (PNG)
    <out>/points.csv               image,x,y   one row per flower centre (pixels)
    <out>/annotated/<name>.png     (annotation="red_cross") copies with pure-red crosses (3.3.2)
    <out>/roi.csv                  image,x,y,width,height   the field's region of interest (3.3.1)
    <out>/distractors.csv          image,kind,x,y,width,height   glare / roadside / shadow boxes

What is drawn, and why: a textured green canopy with brown soil; yellow four-petal flowers of
varying size, some partly hidden by leaves; a skewed count distribution (flowers grow in
patches, most tiles hold few, 3.3.4 / Fig. 3.3); and the scenes that fooled the older blob
counter (3.3.4, 5.1.2): sun glare on leaves (warm bright specks), a dusty roadside with pale
yellowish pebbles, and shadows that dim flowers.
"""
from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np

FLOWER_RGB = np.array([250, 218, 40], dtype=np.float32)   # canola petal yellow
GLARE_RGB = np.array([252, 228, 70], dtype=np.float32)   # sun on waxy leaves: as yellow as a petal in CIELab b*
DUST_RGB = np.array([196, 178, 132], dtype=np.float32)    # dry dirt road
PEBBLE_RGB = np.array([236, 206, 80], dtype=np.float32)  # yellowish stones on the road
RED_CROSS_ARM = 2                                        # "a red cross symbol of size 2" (3.3.2)


def _smooth_noise(rng: np.random.Generator, height: int, width: int, scale: float) -> np.ndarray:
    """Zero-mean, unit-std noise with features about `scale` pixels wide: (height, width)."""
    small = rng.standard_normal((max(2, int(height / scale) + 2), max(2, int(width / scale) + 2)))
    field = cv2.resize(small.astype(np.float32), (width, height), interpolation=cv2.INTER_CUBIC)
    return (field - field.mean()) / (field.std() + 1e-6)


def _canopy(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Green leaves over brown soil, float32 RGB in [0, 255]: (height, width, 3)."""
    green = np.array([62, 112, 42], dtype=np.float32)
    soil = np.array([104, 84, 60], dtype=np.float32)
    soil_mask = np.clip(_smooth_noise(rng, height, width, 60) - 1.0, 0, 1)[..., None]
    image = green * (1 - soil_mask) + soil * soil_mask
    texture = 0.6 * _smooth_noise(rng, height, width, 3) + 0.4 * _smooth_noise(rng, height, width, 12)
    image = image * (1 + 0.18 * texture[..., None])
    # Individual leaves: lighter and darker green ellipses break the noise into plant shapes.
    for _ in range(int(height * width / 400)):
        centre = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (int(rng.integers(3, 9)), int(rng.integers(2, 5)))
        tone = green * rng.uniform(0.75, 1.3)
        cv2.ellipse(image, centre, axes, float(rng.uniform(0, 180)), 0, 360, tone.tolist(), -1)
    return image


def _draw_flower(image: np.ndarray, x: float, y: float, radius: float, rng: np.random.Generator,
                 brightness: float) -> None:
    """Four yellow petals around a darker centre, drawn in place (sub-pixel via shift=4)."""
    colour = np.clip(FLOWER_RGB * brightness * rng.uniform(0.92, 1.05, 3), 0, 255)
    turn = rng.uniform(0, 90)
    s = 16  # fixed-point factor for cv2's shift=4
    for petal in range(4):
        angle = np.deg2rad(turn + 90 * petal)
        cx, cy = x + 0.55 * radius * np.cos(angle), y + 0.55 * radius * np.sin(angle)
        axes = (max(1, int(0.55 * radius * s)), max(1, int(0.36 * radius * s)))
        cv2.ellipse(image, (int(cx * s), int(cy * s)), axes, float(np.rad2deg(angle)), 0, 360,
                    colour.tolist(), -1, cv2.LINE_AA, shift=4)
    centre = np.clip(colour * np.array([0.9, 0.75, 0.6]), 0, 255)
    cv2.circle(image, (int(x * s), int(y * s)), max(1, int(0.22 * radius * s)), centre.tolist(),
               -1, cv2.LINE_AA, shift=4)


def _flower_positions(rng: np.random.Generator, roi: tuple[int, int, int, int], mean_per_tile: float,
                      tile_size: int) -> np.ndarray:
    """Flower centres (N, 2) inside the ROI, clustered in patches (a log-Gaussian Cox process)."""
    x0, y0, w, h = roi
    log_intensity = 1.4 * _smooth_noise(rng, h, w, 2.5 * tile_size)
    intensity = np.exp(log_intensity)
    intensity *= mean_per_tile * (w * h) / (tile_size * tile_size) / intensity.sum()
    expected = float(intensity.sum())
    n = rng.poisson(expected)
    flat = intensity.ravel() / expected
    cells = rng.choice(flat.size, size=n, p=flat)
    ys, xs = np.divmod(cells, w)
    jitter = rng.uniform(0, 1, (n, 2))
    return np.stack([x0 + xs + jitter[:, 0], y0 + ys + jitter[:, 1]], axis=1)


def _speckle(image: np.ndarray, rng: np.random.Generator, box: tuple[int, int, int, int], count: int,
             rgb: np.ndarray, size: tuple[float, float], elongation: float) -> None:
    """Bright flower-sized blobs inside box (glare on leaves, pebbles on a road)."""
    bx, by, bw, bh = box
    for _ in range(count):
        cx, cy = bx + rng.uniform(0, bw), by + rng.uniform(0, bh)
        r = rng.uniform(*size)
        colour = np.clip(rgb * rng.uniform(0.9, 1.04, 3), 0, 255)
        axes = (max(1, int(r * 16)), max(1, int(r * 16 / rng.uniform(1, elongation))))
        cv2.ellipse(image, (int(cx * 16), int(cy * 16)), axes, float(rng.uniform(0, 180)), 0, 360,
                    colour.tolist(), -1, cv2.LINE_AA, shift=4)


def render_field(rng: np.random.Generator, height: int, width: int, roi: tuple[int, int, int, int],
                 tile_size: int, mean_flowers_per_tile: float, flower_radius: tuple[float, float],
                 occlusion: float, distractor_rate: float):
    """One field image. Returns (rgb uint8 (H, W, 3), points (N, 2) x,y, distractors [(kind, box)])."""
    image = _canopy(rng, height, width)
    x0, y0, w, h = roi
    distractors: list[tuple[str, tuple[int, int, int, int]]] = []

    # A dusty roadside along one edge of the frame, reaching into the field window (Fig. 5.4 b).
    if rng.uniform() < distractor_rate:
        # at most the frame above the window's bottom: a short frame cannot hold a deeper road
        depth = min(int(rng.uniform(0.5, 1.6) * tile_size), y0 + h)
        road = (x0, y0 + h - depth, w, depth + (height - y0 - h))
        rx, ry, rw, rh = road
        dust = DUST_RGB * (1 + 0.12 * _smooth_noise(rng, rh, rw, 4)[..., None])
        edge = np.clip(np.linspace(-1, 3, rh), 0, 1)[:, None, None]  # soft field-to-road edge
        image[ry:ry + rh, rx:rx + rw] = image[ry:ry + rh, rx:rx + rw] * (1 - edge) + dust * edge
        _speckle(image, rng, (rx, ry + rh // 4, rw, rh - rh // 4), int(rw * rh / 260), PEBBLE_RGB,
                 flower_radius, 1.6)
        distractors.append(("roadside", (rx, ry, rw, min(rh, y0 + h - ry))))
        field_bottom = ry + rh // 4
    else:
        field_bottom = y0 + h

    points = _flower_positions(rng, (x0, y0, w, field_bottom - y0), mean_flowers_per_tile, tile_size)
    radii = rng.uniform(*flower_radius, len(points))
    for (x, y), r in zip(points, radii):
        _draw_flower(image, x, y, r, rng, brightness=rng.uniform(0.85, 1.05))
        if rng.uniform() < occlusion:  # a leaf in front hides part of the flower, never its centre
            angle = rng.uniform(0, 2 * np.pi)
            lx, ly = x + 1.3 * r * np.cos(angle), y + 1.3 * r * np.sin(angle)
            cv2.ellipse(image, (int(lx * 16), int(ly * 16)), (int(r * 16), int(0.6 * r * 16)),
                        float(np.rad2deg(angle) + 90), 0, 360, [58, 104, 40], -1, cv2.LINE_AA, shift=4)

    # Sun glare: a patch of leaves reflecting warm light as flower-sized bright specks.
    if rng.uniform() < distractor_rate:
        gw, gh = int(rng.uniform(1.5, 4.0) * tile_size), int(rng.uniform(1.5, 3.0) * tile_size)
        gx, gy = x0 + int(rng.uniform(0, max(1, w - gw))), y0 + int(rng.uniform(0, max(1, h - gh)))
        shine = np.zeros((height, width), np.float32)
        cv2.ellipse(shine, (gx + gw // 2, gy + gh // 2), (gw // 2, gh // 2), 0, 0, 360, 1.0, -1)
        image *= (1 + 0.2 * cv2.GaussianBlur(shine, (0, 0), 6))[..., None]
        _speckle(image, rng, (gx, gy, gw, gh), int(gw * gh / 180), GLARE_RGB, flower_radius, 2.5)
        distractors.append(("glare", (gx, gy, gw, gh)))

    # Shadows of poles / neighbouring plants: soft dark ellipses that dim flowers under them.
    if rng.uniform() < distractor_rate:
        sw, sh = int(rng.uniform(0.8, 2.0) * tile_size), int(rng.uniform(0.8, 2.0) * tile_size)
        sx, sy = x0 + int(rng.uniform(0, max(1, w - sw))), y0 + int(rng.uniform(0, max(1, h - sh)))
        mask = np.zeros((height, width), np.float32)
        cv2.ellipse(mask, (sx + sw // 2, sy + sh // 2), (sw // 2, sh // 2), 0, 0, 360, 1.0, -1)
        mask = cv2.GaussianBlur(mask, (0, 0), 4)
        image *= (1 - 0.5 * mask)[..., None]
        distractors.append(("shadow", (sx, sy, sw, sh)))

    image += rng.normal(0, 3, image.shape).astype(np.float32)  # sensor noise
    rgb = np.clip(image, 0, 254).astype(np.uint8)  # never 255: pure red stays reserved for crosses
    return rgb, points, distractors


def draw_red_crosses(rgb: np.ndarray, points: np.ndarray) -> np.ndarray:
    """A copy of rgb with a pure-red (255, 0, 0) cross of arm RED_CROSS_ARM at each point."""
    out = rgb.copy()
    h, w = out.shape[:2]
    for x, y in np.asarray(points).reshape(-1, 2):
        cx, cy = int(x), int(y)
        for d in range(-RED_CROSS_ARM, RED_CROSS_ARM + 1):
            if 0 <= cy < h and 0 <= cx + d < w:
                out[cy, cx + d] = (255, 0, 0)
            if 0 <= cy + d < h and 0 <= cx < w:
                out[cy + d, cx] = (255, 0, 0)
    return out


def field_window(height: int, width: int, tile_size: int) -> tuple[int, int, int, int]:
    """The synthetic field's region of interest (x, y, width, height): whole tiles, centred,
    leaving about half a tile of margin; ValueError when the frame cannot hold one tile."""
    if height < tile_size or width < tile_size:
        raise ValueError(f"a {width}x{height} field cannot hold one {tile_size}-pixel tile")
    roi_w = max(tile_size, (width - tile_size // 2) // tile_size * tile_size)
    roi_h = max(tile_size, (height - tile_size // 2) // tile_size * tile_size)
    return (width - roi_w) // 2, (height - roi_h) // 2, roi_w, roi_h


def generate_field(out_dir: str | Path, num_images: int, height: int, width: int, tile_size: int,
                   seed: int, mean_flowers_per_tile: float = 2.5,
                   flower_radius: tuple[float, float] = (2.5, 5.0), occlusion: float = 0.25,
                   distractor_rate: float = 0.5, annotation: str = "csv") -> Path:
    """Write num_images synthetic field photographs and their annotations under out_dir.

    The region of interest is a window whose sides are multiples of tile_size, centred with a
    margin that stands for the neighbouring fields the thesis cropped away (3.3.1).
    """
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    if annotation == "red_cross":
        (out / "annotated").mkdir(exist_ok=True)
    elif annotation != "csv":
        raise ValueError(f"annotation must be csv or red_cross, got {annotation!r}")
    roi = field_window(height, width, tile_size)
    rng = np.random.default_rng(seed)
    point_rows, roi_rows, distractor_rows = [], [], []
    for i in range(num_images):
        name = f"field_{i:04d}.png"
        rgb, points, distractors = render_field(rng, height, width, roi, tile_size,
                                                mean_flowers_per_tile, tuple(flower_radius),
                                                occlusion, distractor_rate)
        cv2.imwrite(str(out / "images" / name), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        if annotation == "red_cross":
            crossed = draw_red_crosses(rgb, points)
            cv2.imwrite(str(out / "annotated" / name), cv2.cvtColor(crossed, cv2.COLOR_RGB2BGR))
        else:
            point_rows += [(name, f"{x:.2f}", f"{y:.2f}") for x, y in points]
        roi_rows.append((name, *roi))
        distractor_rows += [(name, kind, *box) for kind, box in distractors]
    if annotation == "csv":
        _write_csv(out / "points.csv", ("image", "x", "y"), point_rows)
    _write_csv(out / "roi.csv", ("image", "x", "y", "width", "height"), roi_rows)
    _write_csv(out / "distractors.csv", ("image", "kind", "x", "y", "width", "height"), distractor_rows)
    return out


def _write_csv(path: Path, header: tuple[str, ...], rows: list[tuple]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
