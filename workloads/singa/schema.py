"""The types and ranges of ``singa.*`` (conf/workload/singa.yaml) and of the training
architecture a run resolves (the ``singa.arch`` preset under ``singa.cluster``), as pydantic
models checked by ``validate`` (orchard/config/schema.py: strict types; a bad value is one line naming
the key and the field's description).  What reads a registry, a file or two keys at once (the
arch and data names, the net, which cluster keys an arch may use) stays in ``validate``."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from orchard.api import positive_int, Section

from .settings import APPS, SCHEMES, UPDATERS

POSITIVE_INT = "a positive integer"
AT_LEAST_0 = "an integer >= 0"


def _optional_positive_int() -> Optional[int]:
    return Field(default=None, gt=0, description=POSITIVE_INT)


class Singa(Section):
    app: Literal[APPS] = Field(description="one of " + ", ".join(APPS))
    partition: Literal[SCHEMES] = Field(description="one of " + ", ".join(SCHEMES))
    updater: Optional[Literal[UPDATERS]] = Field(default=None,
                                                 description="null (the app's) or one of " + ", ".join(UPDATERS))
    epochs: Optional[int] = _optional_positive_int()
    batch_size: Optional[int] = _optional_positive_int()
    tsne_samples: Optional[int] = _optional_positive_int()
    threads: Optional[int] = _optional_positive_int()
    max_input_mb: float = Field(default=2048, gt=0, description="a positive number of MiB")
    lr: Optional[float] = Field(default=None, gt=0, description="a positive number")
    target_accuracy: Optional[float] = Field(default=None, gt=0, le=1, description="a fraction in (0, 1]")
    tsne: bool = Field(default=True, description="true or false")
    max_input_mb: Optional[float] = Field(default=None, gt=0, description="a positive number of MiB")


class Arch(Section):
    """The resolved architecture (settings.resolve_arch); its keys are named as ``singa.cluster.*``."""
    worker_groups: int = positive_int()
    workers_per_group: int = positive_int()
    server_groups: int = Field(ge=0, description=AT_LEAST_0)
    servers_per_group: int = Field(ge=0, description=AT_LEAST_0)
    sync_every: int = Field(default=1, gt=0, description=POSITIVE_INT)
    sample_ratio: float = Field(default=1.0, gt=0, le=1, description="a fraction in (0, 1]")
    separate_servers: bool = Field(default=True, description="true or false")
