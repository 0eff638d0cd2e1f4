"""The types and ranges of ``forest.*`` (conf/workload/forest.yaml), as pydantic models checked
by ``validate`` (orchard/config/schema.py: strict types; a bad value is one line naming the key and the
field's description).  What reads two keys at once (feature partitions against offsets, the
memory budget against one node's histogram, the palette) stays in ``validate``."""
from __future__ import annotations

from typing import Optional

from pydantic import Field

from orchard.api import positive_int, Section

POSITIVE = "a positive number"
AT_LEAST_0 = "a number >= 0"


def _probability() -> float:
    return Field(ge=0, le=1, description="a probability in [0, 1]")


class Preprocess(Section):
    """The paper's random transformations (2.1)."""
    flip_prob: float = _probability()
    compose_prob: float = _probability()
    clutter_prob: float = _probability()
    dropout: float = _probability()
    noise_sigma_mm: float = Field(ge=0, description=AT_LEAST_0)
    clutter_objects: int = Field(ge=0, description="an integer >= 0")


class Partitions(Section):
    data_units: int = positive_int()
    features: int = positive_int()
    nodes: int = positive_int()


class Forest(Section):
    train_images: int = positive_int()
    test_images: int = positive_int()
    image_height: int = Field(ge=16, description="an integer of at least 16 pixels")
    image_width: int = Field(ge=16, description="an integer of at least 16 pixels")
    images_per_block: int = positive_int()
    examples_per_image: int = positive_int()
    num_trees: int = positive_int()
    max_depth: int = positive_int()
    n_offsets: int = positive_int()
    # the phase-2 kernel finds a response's bin by a six-step search over 64 (histogram_kernels.py)
    n_thresholds: int = Field(ge=1, le=63, description="an integer from 1 to 63 (2.3 uses 50)")
    min_examples: int = positive_int()
    min_child_examples: int = positive_int()
    figure_images: int = positive_int()
    max_offset_m: float = Field(gt=0, description=POSITIVE)
    threshold_range_mm: float = Field(gt=0, description=POSITIVE)
    background_mm: float = Field(gt=0, description=POSITIVE)
    memory_budget_mb: float = Field(gt=0, description=POSITIVE)
    image_fraction: float = Field(gt=0, le=1, description="a fraction in (0, 1]")
    pixel_fraction: float = Field(gt=0, le=1, description="a fraction in (0, 1]")
    unary_fraction: float = Field(ge=0, le=1, description="a fraction in [0, 1]")
    min_gain: float = Field(ge=0, description=AT_LEAST_0)
    histogram_subtraction: bool = Field(default=True, description="true or false")  # subtraction.py
    bin_cache_mb: float = Field(default=1024, ge=0, description=AT_LEAST_0)  # round_tasks.encode_task
    small_round_example_features: float = Field(ge=0, description=AT_LEAST_0)
    actor_cpus: float = Field(ge=0, le=64, description="CPUs in [0, 64]")
    # the histogram actors' floor per running worker (batch_plan.fill_workers)
    actors_per_worker: float = Field(default=1.0, ge=0, le=1, description="a fraction in [0, 1]")
    stop_after_rounds: Optional[int] = Field(default=None, gt=0, description="a positive integer (or null)")
    preprocess: Preprocess
    partitions: Partitions
