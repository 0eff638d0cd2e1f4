"""What a run or a sweep ended with: the exit code, its MLflow run, its final metrics."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    exit_code: int
    run_id: str | None = None
    metrics: dict = field(default_factory=dict)
    error: str | None = None
