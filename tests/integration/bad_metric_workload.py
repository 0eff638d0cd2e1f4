"""The real singa workload, returning beside its own metrics one whose name MLflow refuses (as a
user's workload does that builds a metric name from its data): the sink must drop that one
alone, count it, and still record the run's final metrics (tests/integration/test_many_runs.py).
Registered as ``singa`` in its own process (``BOOTSTRAP``), so the real singa config composes."""
import workloads.singa as _real
from orchard import registry

BAD = "val/bad metric?"
BOOTSTRAP = ("from orchard import register_workload; "
             "register_workload('singa', 'tests.integration.bad_metric_workload'); "
             "from orchard.cli import main; main()")


def __getattr__(name):  # the rest of the contract (STRATEGIES, resources, checks) is singa's own
    return getattr(_real, name)


def run(cfg, ctx):
    return {**registry.entry(_real, cfg["mode"])(cfg, ctx), BAD: 1.0}
