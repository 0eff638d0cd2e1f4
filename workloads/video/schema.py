"""The types and ranges of ``video.*`` (conf/workload/video.yaml), as pydantic models checked
by ``validate`` (orchard/config/schema.py: strict types; a bad value is one line naming the key and the
field's description).  What reads more than one value or the world stays in ``validate``: folders
and files that must exist, the streams against the registered extractors and the worker counts,
a pool's [min, max] order, a checkpoint to resume from."""
from __future__ import annotations

from typing import Annotated, Dict, Literal, Optional, Union

from pydantic import Field

from orchard.api import positive_int, Section

EVEN_SIZE = "an even size >= 16 pixels"
CPU_SHARE = "a CPU share in (0, 64]"
RATIO = "a ratio in [0, 1]"
DEVIATION = "a standard deviation >= 0"


class Flow(Section):
    method: Literal["farneback", "dis_fast", "dis_medium"] = Field(description="one of farneback, dis_fast, dis_medium")
    bound: float = Field(gt=0, description="a positive number")


class ExtractorOptions(Section):
    flow: Flow


class Inference(Section):
    method: Literal["winner", "avg", "max", "topk", "linear", "attention"] = Field(
        description="one of winner, avg, max, topk, linear, attention")
    window_stride: int = Field(ge=1, description="a stride >= 1 frame")
    motion_ratio: float = Field(ge=0, le=1, description=RATIO)
    confidence_ratio: float = Field(ge=0, le=1, description=RATIO)
    min_motion_contrast: float = Field(ge=0, description="a motion gap >= 0")


class Aggregation(Section):
    folds: int = Field(ge=2, description="at least 2 folds")


class Synthetic(Section):
    """The generated dataset, checked when ``video.root`` is null."""
    num_classes: int = Field(ge=2, le=9, description="2..9 motion classes")
    videos_per_class: int = Field(ge=2, description="at least 2 (one train, one val)")
    size: int = Field(ge=16, multiple_of=2, description=EVEN_SIZE)
    num_frames: int = Field(ge=2, description="at least 2 frames")
    appearance_cue: float = Field(ge=0, le=1, description="a probability in [0, 1]")
    noise: float = Field(ge=0, description=DEVIATION)
    shake: float = Field(ge=0, description=DEVIATION)


class StreamScaling(Section):
    """``strategy.*`` as the streams' Train groups read it (train.launch_streams): with
    ``min_workers`` each stream's group is elastic between min(``min_workers``, its
    ``video.workers`` count) and that count, shrinking after a lost node, growing back when
    one joins (docs/cluster.md, "Losing nodes")."""
    min_workers: Optional[int] = Field(default=None, ge=1, description="null or a worker count >= 1")
    resize_every_s: float = Field(default=60, gt=0, description="a positive number of seconds")


class Video(Section):
    split: int = Field(ge=1, le=9, description="an official split number (1..3)")
    cache: Literal["none", "memory", "disk"] = Field(description="one of none, memory, disk")
    short_rule: Literal["loop", "pad"] = Field(description="one of loop, pad")
    decoder: Literal["pyav"] = Field(description="one of pyav")
    size: int = Field(ge=16, multiple_of=2, description=EVEN_SIZE)
    stack: int = positive_int()
    epochs: int = positive_int()
    clips_per_epoch: int = positive_int()
    val_segments: int = positive_int()
    batch_size: int = positive_int()
    pipeline_batch: int = positive_int()
    fuse_extract: Union[bool, Literal["auto"]] = Field(default="auto", description="true, false or auto")
    offset_stride: int = positive_int()
    min_workers: int = positive_int()
    cpus_per_worker: Dict[str, Optional[Annotated[float, Field(gt=0, le=64)]]] = Field(
        description="a mapping of stream names to null or a CPU share in (0, 64]")
    queue_depth: int = positive_int()
    val_fraction: float = Field(gt=0, lt=1, description="a fraction between 0 and 1")
    target_top1: Optional[float] = Field(ge=0, le=1, description="null or a top-1 accuracy in [0, 1]")
    shift_ratio: float = Field(ge=1, description="a ratio >= 1")
    pause_decode: bool = Field(description="true or false")
    shift_apply: bool = Field(description="true or false")
    cache_max_mb: float = Field(gt=0, description="a positive number of MiB")
    index_max_mb: float = Field(default=64, gt=0, description="a positive number of MiB")
    index_max_mb: float = Field(gt=0, description="a positive number of MiB")
    object_store_mb: Optional[float] = Field(gt=0, description="null or a positive number of MiB")
    decode_cpus: float = Field(gt=0, le=64, description=CPU_SHARE)
    extract_cpus: float = Field(gt=0, le=64, description=CPU_SHARE)
    extractor_options: ExtractorOptions
    inference: Inference
    aggregation: Aggregation
