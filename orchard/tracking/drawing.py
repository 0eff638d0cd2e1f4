"""Figures drawn beside the run's last work: ``RunContext.draw``.

A run ends with work that needs the driver (the model's export and logging, reading the store)
and figures that need only their data. Drawn on the driver, the figures wait for the model and
the model for them while another core may sit idle. ``draw`` runs a workload's figure function
in a Ray task instead, with the run's context (which logs from anywhere), and the driver goes on;
``Drawing.result`` waits for it where the driver needs its figures done and returns what the
function returned. A drawing nobody waited for is waited for as the workload returns
(``wait_all``): no figure is lost, and a figure that fails fails the run with its own error, as
it would have on the driver.

It pays where the task finds a Ray worker process already running (forest's own tasks leave
theirs): a new worker process costs more than the figures on 2 cores (docs/runs.md, "Figures
beside the model"). The task asks for no CPU (``num_cpus=0``): a figure never waits behind a
sweep's trials for a core it uses for a second. It runs on the driver's node where it can (a worker
node lost meanwhile does not reach it) and is drawn again if its worker is lost.
"""
from __future__ import annotations

from typing import Any, Callable

import ray


@ray.remote(num_cpus=0, max_retries=3)  # a lost worker: drawn again (the same artifacts, written over)
def _draw(fn: Callable, ctx, kwargs: dict) -> Any:
    out = fn(ctx, **kwargs)
    ctx.flush()  # what it logged is in the store before the driver waits no more and closes the run
    return out


class Drawing:
    """A figure function running in a Ray task; ``result()`` waits for it."""

    def __init__(self, ref):
        self._ref = ref
        self._done, self._value, self._error = False, None, None

    def result(self) -> Any:
        """What the figure function returned, once it is done; its own exception if it raised
        (anything else, an interrupt or a worker lost for good, leaves it to be waited for again)."""
        if not self._done:
            try:
                self._value = ray.get(self._ref)
            except ray.exceptions.RayTaskError as exc:  # the function's error (ray.get raises it as its own type too)
                self._error = exc
            self._done = True
        if self._error is not None:
            raise self._error
        return self._value


def start(fn: Callable, ctx, kwargs: dict) -> Drawing:
    """``fn(ctx, **kwargs)`` on the driver's node where it can be (no worker node's loss reaches it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return Drawing(_draw.options(scheduling_strategy=here).remote(fn, ctx, kwargs))


def wait_all(drawings: list[Drawing]) -> None:
    """Every drawing done (the first error raised once all have ended)."""
    error = None
    for drawing in drawings:
        try:
            drawing.result()
        except Exception as exc:  # noqa: BLE001 - raised below, after the others are done
            error = error or exc
    drawings.clear()
    if error is not None:
        raise error
