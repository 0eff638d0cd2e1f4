"""``python -m orchard --multirun workload=<name> key=a,b`` through Hydra's own sweeper.

Each job is a full orchard run (validated, tracked) in turn; Ray is started once and reused.
"""
from __future__ import annotations

import sys

from orchard import config as config_lib


def run_multirun(overrides: list[str]) -> int:
    import hydra
    from omegaconf import DictConfig

    from orchard.cli import prepare, run_one
    from orchard import cluster
    from orchard.errors import ConfigError

    failures = []
    started = []

    @hydra.main(config_path=str(config_lib.conf_dir()), config_name="config", version_base="1.3")
    def job(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        job_overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra.")]
        try:
            plain, module = prepare(job_overrides)
        except ConfigError as err:
            print(f"orchard: bad config: {err}", file=sys.stderr)
            failures.append(2)
            return
        if cluster.connect(plain["cluster"]):
            started.append(True)
        outcome = run_one(plain, module)
        if outcome.exit_code:
            failures.append(outcome.exit_code)

    from orchard import registry

    extra = registry.extra_config_dirs()
    if extra:
        overrides = [*overrides, "hydra.searchpath=[" + ",".join(f"file://{d}" for d in extra) + "]"]
    sys.argv = [sys.argv[0], "--multirun", *overrides, "hydra.job.chdir=false"]
    try:
        job()
    except SystemExit as exc:  # Hydra exits on its own errors (e.g. a bad sweep override)
        failures.append(exc.code if isinstance(exc.code, int) and exc.code else 2)
    finally:
        if started:  # leave a Ray session that someone else started (tests, notebooks) running
            cluster.shutdown()
    return max(failures) if failures else 0
