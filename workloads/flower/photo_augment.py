"""What a camera does to a field between the flowers and the file, as training augmentation.

The synthetic field is rendered losslessly, but cameras write JPEG: a model that only ever saw
lossless tiles counted 29% fewer flowers on a quality-90 JPEG of a field than on its PNG (issue
52), since the encoder's 4:2:0 chroma subsampling and quantisation wash the yellow out of petals
a few pixels across. So the loader passes every training tile through a camera's pipeline, in
its order: exposure and white balance (brightness, contrast, a gain per colour channel), the
optics (a mild Gaussian blur), the sensor (Gaussian noise), and last the encoder (JPEG at a
random quality). None of them moves a flower, so the density targets, and so the counts, stay
the truth; the test tiles are scored as they were rendered.

Each batch's draws come from its own generator (``batch_rng``: the run's seed, the epoch, the
worker and the batch's place in the epoch), so a run is the same whatever loader thread made
which batch, and a resumed run degrades its tiles as the unbroken run did.
"""
from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

# libjpeg's (and PIL's) default chroma subsampling, the one most cameras and phones write
SAMPLING_420 = [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]


def batch_rng(key: tuple[int, ...], batch: int) -> np.random.Generator:
    """The generator of one batch: ``key`` (run seed, epoch, rank) and the batch's number in the
    epoch; a stream of its own, apart from the epoch's shuffle (seeded by ``key`` alone)."""
    return np.random.default_rng([*(int(k) for k in key), int(batch)])


def jpeg_round_trip(rgb: np.ndarray, quality: int) -> np.ndarray:
    """An RGB uint8 image (H, W, 3) encoded as a JPEG of ``quality`` (1-100, 4:2:0) and decoded."""
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(rgb[..., ::-1]),  # OpenCV encodes BGR
                               [cv2.IMWRITE_JPEG_QUALITY, int(quality), *SAMPLING_420])
    if not ok:
        raise RuntimeError("OpenCV could not encode a JPEG")
    return cv2.imdecode(encoded, cv2.IMREAD_COLOR)[..., ::-1]


@dataclass(frozen=True)
class PhotoDegradation:
    """The ``flower.augment`` settings (conf/workload/flower.yaml), applied to a batch of tiles.

    Probabilities are per tile; ranges are [low, high] drawn uniformly; ``brightness``,
    ``contrast`` and ``colour`` are the largest relative change either way (0: none)."""
    jpeg_probability: float
    jpeg_quality: tuple[int, int]
    blur_probability: float
    blur_sigma: tuple[float, float]      # pixels
    noise_probability: float
    noise_std: tuple[float, float]       # grey levels of 255
    brightness: float
    contrast: float
    colour: float

    @classmethod
    def from_config(cls, section: dict | None) -> PhotoDegradation | None:
        """The degradation ``flower.augment`` asks for; None where it is null (lossless training)."""
        if section is None:
            return None
        fields = {name: section[name] for name in cls.__dataclass_fields__}
        for name in ("jpeg_quality", "blur_sigma", "noise_std"):
            fields[name] = tuple(fields[name])
        return cls(**fields)

    def __call__(self, tiles: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Degrade ``tiles`` (B, T, T, 3) RGB uint8 in place, with draws from ``rng``; returns them.

        Every draw is made for every tile whether or not it is used, so one tile's luck never
        shifts the next tile's draws."""
        n = len(tiles)
        exposure = 1 + rng.uniform(-self.brightness, self.brightness, n)
        contrast = 1 + rng.uniform(-self.contrast, self.contrast, n)
        gains = 1 + rng.uniform(-self.colour, self.colour, (n, 3))
        blur = rng.uniform(size=n) < self.blur_probability
        sigmas = rng.uniform(*self.blur_sigma, n)
        noisy = rng.uniform(size=n) < self.noise_probability
        noise_std = rng.uniform(*self.noise_std, n)
        jpeg = rng.uniform(size=n) < self.jpeg_probability
        qualities = rng.integers(self.jpeg_quality[0], self.jpeg_quality[1] + 1, n)
        noise_seeds = rng.integers(0, 2**63, n)
        for i in range(n):
            # [1] exposure and white balance: contrast about the tile's mean grey, then the gains
            x = tiles[i].astype(np.float32)
            mean = x.mean()
            x = ((x - mean) * contrast[i] + mean) * (exposure[i] * gains[i])
            # [2] the optics: a blur of under a pixel or two spreads a flower, never moves it
            if blur[i] and sigmas[i] > 0:
                x = cv2.GaussianBlur(x, (0, 0), float(sigmas[i]), borderType=cv2.BORDER_REFLECT_101)
            # [3] the sensor
            if noisy[i]:
                x += np.random.default_rng(noise_seeds[i]).normal(0, noise_std[i], x.shape).astype(np.float32)
            out = np.clip(np.rint(x), 0, 255).astype(np.uint8)
            # [4] the encoder, last, as in a camera
            tiles[i] = jpeg_round_trip(out, qualities[i]) if jpeg[i] else out
        return tiles
