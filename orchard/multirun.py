"""``python -m orchard --multirun workload=<name> key=a,b`` through Hydra's own sweeper.

Each job is a full orchard run through ``orchard.lifecycle`` (validated, checked, tracked);
Ray is started once and reused.  Ctrl-C or SIGTERM ends the job under way as KILLED and stops
the multirun (exit 130/143); the jobs not yet started are not run.
"""
from __future__ import annotations

import sys

from orchard import config as config_lib
from orchard import interrupts, lifecycle
from orchard.console import say
from orchard.errors import ConfigError


def run_multirun(overrides: list[str]) -> int:
    import hydra
    from omegaconf import DictConfig

    from orchard import cluster

    failures: list[int] = []
    started: list[bool] = []
    stopped: list[int] = []  # an interrupted job's exit code: the jobs after it are skipped

    @hydra.main(config_path=str(config_lib.conf_dir()), config_name="config", version_base="1.3")
    def job(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        if stopped:
            return
        job_overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra.")]
        try:
            plain, module = lifecycle.prepare(job_overrides)
            lifecycle.preflight(plain)
        except ConfigError as err:
            say(f"orchard: bad config: {err}", file=sys.stderr)
            failures.append(2)
            return
        if cluster.connect(plain["cluster"]):
            started.append(True)
            interrupts.install()  # ray.init put its own SIGTERM handler in place
        lifecycle.reap_lost_runs(plain)
        outcome = lifecycle.run_one(plain, module)
        if outcome.exit_code:
            failures.append(outcome.exit_code)
        if outcome.exit_code > 128:
            stopped.append(outcome.exit_code)

    overrides = [*overrides, *config_lib.searchpath_override()]
    sys.argv = [sys.argv[0], "--multirun", *overrides, "hydra.job.chdir=false"]
    try:
        with interrupts.raising():
            job()
    except KeyboardInterrupt as exc:  # between jobs
        return interrupts.exit_code(exc)
    except SystemExit as exc:  # Hydra exits on its own errors (e.g. a bad sweep override)
        failures.append(exc.code if isinstance(exc.code, int) and exc.code else 2)
    finally:
        if started:  # leave a Ray session that someone else started (tests, notebooks) running
            with interrupts.deferred():
                cluster.shutdown()
    if stopped:
        return stopped[0]
    return max(failures) if failures else 0
