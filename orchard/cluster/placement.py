"""What one run of a workload holds in Ray, and how a sweep reserves it for each trial.

A workload answers ``resources(cfg) -> Resources`` (its contract, ``workloads/<name>/__init__.py``)
from what it really starts.  A Tune trial is the process that runs ``run_one``; Ray Tune gives it
a placement group and *captures* into that group every task and actor the trial starts with
Ray's default scheduling.  So a run's needs come in two kinds:

    in_trial   bundles for the tasks and actors the run starts itself (forest's histogram tasks,
               flower's tiling tasks, parameter servers that hold CPUs, video's probe tasks and
               Ray Data pools): reserved in the trial's placement group, after its head.
    outside    bundles the run takes outside that group: a Ray Train worker group, which makes a
               placement group of its own, and actors placed with a scheduling strategy of their
               own (singa's SPREAD worker groups).  They are not reserved by the trial; the sweep
               runs only as many trials at once as the cluster can hold (``max_concurrent``).

The trial's head (the ``run_one`` process) waits on its workers and takes no CPU: it reserves
``HEAD`` (a little memory; Tune refuses an empty head with nothing after it), so a Train run's
workers can have every CPU of the cluster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchard.errors import ConfigError

HEAD = {"memory": 128 * 2**20}  # bytes; Ray's logical memory resource, not a CPU the workers need


def bundles(n: int, cpu: float = 1.0, gpu: float = 0.0) -> tuple[dict, ...]:
    """``n`` equal bundles ``{"CPU": cpu, "GPU": gpu}`` (zero entries left out)."""
    one = {k: float(v) for k, v in (("CPU", cpu), ("GPU", gpu)) if v}
    return tuple(dict(one) for _ in range(int(n))) if one else ()


@dataclass(frozen=True)
class Resources:
    """One run's Ray resources as placement-group bundles, e.g. ``({"CPU": 1.0},)``."""

    in_trial: tuple = field(default_factory=tuple)
    outside: tuple = field(default_factory=tuple)

    def factory(self):
        """The trial's ``tune.PlacementGroupFactory``: the head, then the ``in_trial`` bundles."""
        from ray import tune

        return tune.PlacementGroupFactory([dict(HEAD), *[dict(b) for b in self.in_trial if any(b.values())]])

    def per_trial(self) -> dict[str, float]:
        """Everything one trial holds at once: head + in_trial + outside, summed per resource."""
        total: dict[str, float] = {}
        for bundle in (HEAD, *self.in_trial, *self.outside):
            for key, value in bundle.items():
                total[key] = total.get(key, 0.0) + float(value)
        return {k: v for k, v in total.items() if v > 0}

    def max_concurrent(self, cluster: dict[str, float], requested: int | None = None) -> int:
        """How many trials the cluster holds at once (at most ``requested``); raises
        ``ConfigError`` when not even one fits."""
        need = self.per_trial()
        fits = []
        for key, value in need.items():
            have = float(cluster.get(key, 0.0))
            fits.append(math.floor(have / value + 1e-9))
        n = min(fits, default=1)
        if n < 1:
            short = ", ".join(f"{k} {v:g} (cluster: {float(cluster.get(k, 0.0)):g})" for k, v in need.items()
                              if float(cluster.get(k, 0.0)) + 1e-9 < v and k != "memory")
            raise ConfigError("sweep", f"a cluster that holds one trial; one trial needs {short or need} "
                              f"({self.describe()}); fewer workers (strategy.num_workers) or a bigger cluster")
        return min(n, int(requested)) if requested else n

    def describe(self) -> str:
        """One line for the console: ``in trial 1 CPU; outside 2 x {CPU: 1}``."""
        def group(bs) -> str:
            if not bs:
                return "nothing"
            counts: dict[str, int] = {}
            for b in bs:
                label = "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(b.items())) + "}"
                counts[label] = counts.get(label, 0) + 1
            return " + ".join(f"{n} x {label}" for label, n in counts.items())

        return f"in the trial's placement group {group(self.in_trial)}; outside it {group(self.outside)}"
