"""orchard: one command runs four published distributed-training systems on Ray.

Public API for workloads: ``RunContext`` (metrics, artifacts, progress from anywhere in the
Ray cluster), ``ConfigError`` (one-line config errors), ``register_workload``.
"""
from orchard.config.registry import register_workload
from orchard.errors import ConfigError

__version__ = "0.2.0.dev0"  # pyproject's version (CHANGELOG.md says what it holds)
__all__ = ["ConfigError", "RunContext", "register_workload", "__version__"]


def __getattr__(name):
    # RunContext pulls in Ray; keep `import orchard` light for config-only use.
    if name == "RunContext":
        from orchard.tracking.context import RunContext

        return RunContext
    raise AttributeError(name)
