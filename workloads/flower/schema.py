"""The types and ranges of ``flower.*`` (conf/workload/flower.yaml), as pydantic models checked
by ``validate`` (orchard/config/schema.py: strict types; a bad value is one line naming the key and the
field's description).  What reads more than one value at once (the count bins' order, a data
folder's files, the tile against the field and the GPU settings: preflight.py) stays in ``validate``."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, Field

from orchard.api import positive_int, Section

POSITIVE = "a positive number"


def _sized(roi: list[float]) -> list[float]:
    if roi[2] <= 0 or roi[3] <= 0:
        raise ValueError("width and height must be positive")
    return roi


def _ordered(pair: list) -> list:
    if pair[0] > pair[1]:
        raise ValueError("low above high")
    return pair


def _range(low_bound: float, high_bound: float, kind: type, description: str):
    """A field for a [low, high] pair with low_bound <= low <= high <= high_bound."""
    item = Annotated[kind, Field(ge=low_bound, le=high_bound)]
    return Annotated[list[item], Field(min_length=2, max_length=2, description=description), AfterValidator(_ordered)]


PROBABILITY = "a probability in [0, 1]"


class Augment(Section):
    """``flower.augment``: the photo degradations of training (photo_augment.py)."""
    brightness: float = Field(ge=0, lt=1, description="a relative change in [0, 1)")
    contrast: float = Field(ge=0, lt=1, description="a relative change in [0, 1)")
    colour: float = Field(ge=0, lt=1, description="a relative change in [0, 1)")
    blur_probability: float = Field(ge=0, le=1, description=PROBABILITY)
    blur_sigma: _range(0, 10, float, "[low, high] blur sigma in pixels, 0 <= low <= high <= 10")
    noise_probability: float = Field(ge=0, le=1, description=PROBABILITY)
    noise_std: _range(0, 64, float, "[low, high] noise sigma in grey levels, 0 <= low <= high <= 64")
    jpeg_probability: float = Field(ge=0, le=1, description=PROBABILITY)
    jpeg_quality: _range(1, 100, int, "[low, high] JPEG qualities, 1 <= low <= high <= 100")


class Synthetic(Section):
    annotation: Literal["csv", "red_cross"] = Field(description="one of csv, red_cross")


class Optimizer(Section):
    name: Literal["sgd", "adagrad", "adam"] = Field(description="one of sgd, adagrad, adam")
    lr: float = Field(gt=0, description=POSITIVE)


class Flower(Section):
    tile_size: int = Field(gt=0, multiple_of=4, description="a positive multiple of 4 (the model pools twice by 2x2)")
    batch_size: int = positive_int()
    epochs: int = positive_int()
    prefetch: int = positive_int()
    val_every: int = positive_int()
    log_every: int = positive_int()
    eval_batch_size: int = positive_int()
    sigma: float = Field(gt=0, description=POSITIVE)
    density_scale: float = Field(gt=0, description=POSITIVE)
    train_fraction: float = Field(gt=0, lt=1, description="a fraction in (0, 1)")
    val_fraction: float = Field(ge=0, lt=0.5, description="a fraction in [0, 0.5): training tiles held back")
    roi: Optional[Annotated[list[float], Field(min_length=4, max_length=4), AfterValidator(_sized)]] = Field(
        description="null or [x, y, width, height] (width and height > 0)")
    max_image_pixels: Optional[int] = Field(
        gt=0, description="null (no limit) or a positive number of pixels (width x height)")
    max_skipped_fraction: float = Field(
        ge=0, le=1, description="a fraction in [0, 1] of the photos that may be unreadable before the run fails")
    precision: Literal["fp32", "bf16", "fp16"] = Field(description="one of fp32, bf16, fp16")
    channels_last: bool = Field(description="true or false")
    compile: bool = Field(description="true or false")
    loader_threads: Optional[int] = Field(gt=0, description="null (the worker's CPUs decide) or a positive integer")
    eval_device: str = Field(pattern=r"^(auto|cpu)$|^cuda", description="auto, cpu or cuda[:index]")
    augment: Optional[Augment] = Field(description="null (lossless training) or the photo degradations' settings")
    synthetic: Synthetic
    optimizer: Optimizer
