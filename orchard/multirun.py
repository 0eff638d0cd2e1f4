"""``python -m orchard --multirun workload=<name> key=a,b`` through Hydra's own sweeper.

Each job is a full orchard run (validated, tracked) in turn; Ray is started once and reused.
"""
from __future__ import annotations

import sys

from orchard import config as config_lib


def run_multirun(overrides: list[str]) -> int:
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from orchard.cli import prepare, run_one
    from orchard import cluster
    from orchard.errors import ConfigError

    failures = []

    @hydra.main(config_path=str(config_lib.conf_dir()), config_name="config", version_base="1.3")
    def job(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        job_overrides = list(HydraConfig.get().overrides.task)
        try:
            plain, module = prepare(job_overrides)
        except ConfigError as err:
            print(f"orchard: bad config: {err}", file=sys.stderr)
            failures.append(2)
            return
        cluster.connect(plain["cluster"])
        outcome = run_one(plain, module)
        if outcome.exit_code:
            failures.append(outcome.exit_code)

    sys.argv = [sys.argv[0], "--multirun", *overrides, "hydra.job.chdir=false"]
    try:
        job()
    finally:
        cluster.shutdown()
    return max(failures) if failures else 0
