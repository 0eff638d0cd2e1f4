"""Training that diverges stops clean: the one finiteness check every training loop calls.

A loop hands ``check`` the losses of each logged step, and ``check_weights`` its parameters
before it writes a checkpoint; the first NaN or infinity raises ``orchard.errors.Diverged``,
which names where it happened and the config key to change (the workload's learning rate).
So no checkpoint is ever overwritten by non-finite weights (the last finite one is kept), and
the steps after it (the model logged to MLflow, figures) never run.  The run lifecycle ends the
run FAILED, exit 1, with that one line, and its summary offers ``resume`` only with a new value
for the key (docs/runs.md, "Divergence").

Where the loop runs on Ray workers, the worker raises (or hands ``err.fields()`` to the driver)
and the driver raises the same ``Diverged`` again; ``log`` records ``train/diverged_at_step``.
"""
from __future__ import annotations

import math
from typing import Iterable

from orchard.errors import Diverged

METRIC = "train/diverged_at_step"


def word(value: float) -> str:
    """How a non-finite number reads in the line: ``NaN``, ``inf`` or ``-inf``."""
    return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def non_finite(values: dict[str, float]) -> tuple[str, float] | None:
    """The first ``(name, value)`` of ``values`` that is NaN or infinite, else None."""
    for name, value in values.items():
        if value is not None and not math.isfinite(float(value)):
            return name, float(value)
    return None


def check(values: dict[str, float], *, epoch: int, step: int, key: str | None, value=None, hint: str = "") -> None:
    """Raise ``Diverged`` if a value of ``values`` (a logged step's losses, ``{"loss": 0.3}``)
    is NaN or infinite; ``key``/``value``: the config key to lower and its value now."""
    bad = non_finite(values)
    if bad is not None:
        raise Diverged(bad[0], word(bad[1]), epoch, step, key, value, hint)


def all_finite(tensors: Iterable) -> bool:
    """Whether every array or tensor of ``tensors`` (numpy arrays, torch tensors: a dict's
    values, a module's ``parameters()``) holds finite numbers only."""
    import numpy as np

    for t in tensors:
        if hasattr(t, "detach"):  # torch, on whatever device: one reduction, one read
            import torch

            if not bool(torch.isfinite(t.detach()).all()):
                return False
        elif not np.isfinite(np.asarray(t)).all():
            return False
    return True


def check_weights(tensors: Iterable, *, epoch: int, step: int, key: str | None, value=None, hint: str = "") -> None:
    """Raise ``Diverged`` (``what="weights"``) unless ``all_finite(tensors)``: called before a
    checkpoint is written, so one of non-finite weights never replaces the last finite one."""
    if not all_finite(tensors):
        raise Diverged("weights", "NaN or inf", epoch, step, key, value, hint)


def log(ctx, err: Diverged) -> None:
    """Record ``train/diverged_at_step`` (at that step) in the run, and the line as a tag."""
    ctx.log_metrics({METRIC: float(err.step)}, step=err.step)
    ctx.set_tags({TAG: str(err), **({KEY_TAG: err.key} if err.key else {})})


TAG, KEY_TAG = "orchard.diverged", "orchard.diverged_key"


def resume_guard(tags: dict, overrides: list[str]) -> str | None:
    """Why ``resume`` of a run with these tags and these extra overrides would diverge again
    (None: it may go on): a diverged run goes on only with a new value for its key."""
    if TAG not in tags:
        return None
    key = tags.get(KEY_TAG)
    if key and not any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides):
        return f"a new value for {key}: the run diverged ({tags[TAG]}); python -m orchard resume <id> {key}=..."
    return None
