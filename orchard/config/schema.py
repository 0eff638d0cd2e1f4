"""The core's config schema: the types and ranges of ``strategy``, ``cluster``, ``tracking`` and
the root's own keys, as pydantic models (strict: ``"2"`` is not an integer, ``true`` is not a
number).  A value outside them is orchard's one line: the key, the field's description (what is
allowed) and the value given.  Keys the schema does not name pass (they belong to a workload or
a strategy); checks that read two keys at once or the workload stay in ``config.validate``.

This is the pattern for a workload's own checks: a model per section, ``check(model, section,
prefix)`` in its ``validate``.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.config.levels import LIBRARY_LOG_LEVELS
from orchard.errors import ConfigError

MLFLOW_URI = r"^((sqlite|http|https|file|postgresql|mysql|databricks)[:+]|databricks$)"  # databricks alone: MLflow's default workspace


class Section(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


def positive_int():
    """A field for a positive integer (the workloads' schemas share it)."""
    return Field(gt=0, description="a positive integer")


class Strategy(Section):
    num_workers: int = Field(gt=0, description="a positive integer")
    cpus_per_worker: float = Field(ge=0, description="a number >= 0")
    gpus_per_worker: float = Field(ge=0, description="a number >= 0")
    max_failures: int = Field(ge=-1, description="an integer >= -1 (-1: retry forever)")
    worker_niceness: int = Field(default=0, ge=0, le=19, description="an integer from 0 to 19")


class ParameterServers(Strategy):
    """``strategy=ps``."""
    num_servers: int = Field(gt=0, description="a positive integer")
    mode: Literal["sync", "async"] = Field(description="one of sync, async")
    async_average: bool = Field(default=False, description="true or false")


class Cluster(Section):
    mode: Literal["local", "remote"] = Field(description="one of local, remote")
    ray_log_level: Literal[LIBRARY_LOG_LEVELS] = Field(default="WARNING",
                                                       description="one of " + ", ".join(LIBRARY_LOG_LEVELS))
    worker_start_timeout_s: Optional[float] = Field(default=None, gt=0, description="a positive number (or null)")


class RemoteCluster(Cluster):
    """``cluster=remote``."""
    address: str = Field(pattern=r"^(auto|ray://.+|https?://.+|.+:.*)$", description="auto, ray://host:10001 or host:6379")


class Tracking(Section):
    """``tracking.enabled=true``."""
    uri: str = Field(pattern=MLFLOW_URI,
                     description="an MLflow tracking URI such as sqlite:///mlflow.db or http://127.0.0.1:5000")
    sample_interval_s: float = Field(gt=0, description="a positive number")
    max_series_points: int = Field(default=10_000, ge=2, description="an integer >= 2")


class Logs(Section):
    max_mb: float = Field(gt=0, description="a positive number of MiB")
    backups: int = Field(ge=0, description="an integer >= 0")


class Core(Section):
    mode: Literal["train", "predict"] = Field(description="one of train, predict")
    progress: Literal["auto", "always", "never"] = Field(description="one of auto, always, never")
    verbose: bool = Field(description="one of True, False")
    # numpy's generators, which every workload seeds from it (its data, sampling, init), take no
    # negative seed: a run failed in its first task
    seed: int = Field(ge=0, description="an integer >= 0")
    strategy: Strategy
    cluster: Cluster
    logs: Logs


class Asha(Section):
    max_t: int = Field(default=1000, gt=0, description="a positive integer")
    grace_period: int = Field(default=1, gt=0, description="a positive integer")
    reduction_factor: float = Field(default=2, gt=1, description="a number > 1")


class Sweep(Section):
    """``sweep=<name>`` (conf/sweep/*.yaml, docs/sweeps.md); ``params`` is checked against the
    composed config in ``sweep.validate_sweep`` (its keys are the config's)."""
    name: str = Field(min_length=1, description="a name")
    metric: str = Field(pattern=r"^[^/\s]+/\S+$", description="a metric key such as val/mae")
    mode: Literal["min", "max"] = Field(description="one of min, max")
    num_samples: int = Field(gt=0, description="a positive integer")
    max_concurrent_trials: Optional[int] = Field(default=None, gt=0, description="a positive integer (or null)")
    scheduler: Literal["fifo", "asha"] = Field(description="one of fifo, asha")
    asha: Optional[Asha] = None
    # ``register`` is a name of pydantic's BaseModel too: the field takes it as its alias
    register_name: Optional[str] = Field(default=None, alias="register", pattern=r"\S",
                                         description="null or a Model Registry name for the best trial's model")
    max_failures: int = Field(default=2, ge=0, description="an integer >= 0 (retries of a trial whose process was lost)")
    fit_gpu_memory: bool = Field(default=True, description="true or false (trials that share a GPU: as many at once "
                                                           "as its memory holds, from their measured peaks)")


def check(model: type[BaseModel], values: dict, prefix: str = "") -> None:
    """``values`` as ``model`` allows them, else ConfigError naming the first key that is not."""
    try:
        model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc, given = first["loc"], first["input"]
        if any(isinstance(part, int) for part in loc):  # an item of a list: name the list, show it whole
            loc = loc[:next(i for i, part in enumerate(loc) if isinstance(part, int))]
            given = _value(values, loc)
        key = ".".join(filter(None, [prefix, *map(str, loc)]))
        if first["type"] == "missing":
            raise ConfigError(key, "missing from the config") from None
        field = _field(model, loc)
        allowed = field.description if field is not None and field.description else first["msg"]
        raise ConfigError(key, f"{allowed}, got {given!r}") from None


def _value(values: dict, loc: tuple):
    """The value at ``loc`` in the nested dicts ``values``."""
    for part in loc:
        values = values[part]
    return values


def _field(model: type[BaseModel], loc: tuple):
    """The schema's field at ``loc`` (through nested models), or None."""
    field = None
    for part in loc:
        fields = {f.alias or name: f for name, f in getattr(model, "model_fields", {}).items()}
        if part not in fields:
            return field
        field = fields[part]
        model = _model_in(field.annotation)
    return field


def _model_in(annotation):
    """The pydantic model a field holds, also through ``Optional[...]`` (``sweep.asha``)."""
    import typing

    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation
