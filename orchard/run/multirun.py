"""``python -m orchard --multirun workload=<name> key=a,b``: Hydra's sweep syntax, orchard's jobs.

The overrides are parsed by Hydra's ``OverridesParser`` and expanded as Hydra's basic sweeper
does (``a,b``, ``range(...)``, ``choice(...)``, ``glob(...)``: every combination, in the order
given).  Every job's config is composed and checked before anything starts, so a bad key is one
line and exit 2 whichever job has it.  Each job is then a full orchard run through
``orchard.run.lifecycle``, in the folder ``hydra.sweep.dir``/``hydra.sweep.subdir`` names
(``<output_dir>/<workload>/<run id>``, beside single runs); Ray is started once and reused.
Ctrl-C or SIGTERM ends the job under way as KILLED and stops the multirun (exit 130/143); the
jobs not yet started are not run.
"""
from __future__ import annotations

import contextlib
import itertools
import sys

from orchard import config as config_lib
from orchard.config import errors as config_errors
from orchard.errors import ConfigError
from orchard.run import lifecycle
from orchard.terminal import interrupts
from orchard.terminal.console import say


def expand(overrides: list[str]) -> list[list[str]]:
    """The jobs of a multirun: one list of plain overrides per combination of the sweeps."""
    with config_lib.hydra_context() as hydra:  # glob(...) lists a group's options through Hydra
        parsed = config_errors.parse(overrides, hydra.config_loader())
        axes: dict[str, list[str]] = {}  # a key given twice: the last one counts, as in Hydra
        for override in parsed:
            key = override.get_key_element()
            if not override.is_sweep_override():
                axes[key] = [override.input_line]
            elif override.is_discrete_sweep():
                axes[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
            else:
                raise ConfigError(override.key_or_group, "a list of values under --multirun (a,b | range(...) | "
                                  "choice(...) | glob(...)); for interval(...) use a Ray Tune search: sweep=<name>")
    return [list(job) for job in itertools.product(*axes.values())]


def prepare_jobs(overrides: list[str]) -> list[tuple[dict, object]]:
    """Every job composed and validated (nothing started); raises ConfigError."""
    jobs = expand(overrides)
    prepared = []
    for num, job in enumerate(jobs):
        # hydra.mode and hydra.job.num as Hydra sets them for a job: its folder is hydra.sweep.*
        cfg, module = lifecycle.prepare([*job, "hydra.mode=MULTIRUN", f"hydra.job.num={num}"])
        cfg["_overrides"] = job  # what the user typed, for this job (resume, overrides.yaml)
        config_lib.check(cfg, module)  # every job's before the first runs (execute need not again)
        cfg["_checked"] = True
        prepared.append((cfg, module))
    return prepared


def run_multirun(overrides: list[str], console: bool = False) -> int:
    """Run every job; the exit code is the worst job's (an interrupted job's stops the rest).

    Each job takes the single run's path, ``lifecycle.execute`` (the fit check, the lost-run
    reaper, the run, the teardown of what the run left in Ray, the same exit codes), inside one
    Ray session started for the first job and kept for the rest, so Ray starts once.

    ``console``: the CLI's terminal shows orchard's lines only, as for a single run (tests that
    call this in-process keep theirs)."""
    try:
        jobs = prepare_jobs(overrides)
    except ConfigError as err:
        say(f"orchard: bad config: {err}", file=sys.stderr)
        return 2
    failures: list[int] = []
    runnable = []
    for num, (cfg, module) in enumerate(jobs):  # every job's folder, store and cluster checked before Ray starts
        try:
            lifecycle.preflight(cfg, module)
        except ConfigError as err:
            say(f"orchard: bad config: {err}", file=sys.stderr)
            failures.append(2)
            continue
        runnable.append((num, cfg, module))
    if runnable and console:  # the first job's config line; Ray's, Train's and torch's lines to the log
        lifecycle.open_console(runnable[0][1])
    try:
        with interrupts.raising():
            # one Ray for every job (left running if someone else started it: tests, notebooks);
            # raising() again once Ray is up: ray.init installs a SIGTERM handler of its own
            with (lifecycle.ray_session(runnable[0][1]) if runnable else contextlib.nullcontext()), interrupts.raising():
                for num, cfg, module in runnable:
                    say(f"orchard: multirun job {num + 1}/{len(jobs)}"
                        + ("" if console else f": {' '.join(cfg['_overrides'])}"))
                    if console and cfg is not runnable[0][1]:
                        lifecycle.open_console(cfg)
                    outcome = lifecycle.execute(cfg, module)
                    if outcome.exit_code > 128:
                        return outcome.exit_code
                    if outcome.exit_code:
                        failures.append(outcome.exit_code)
    except lifecycle.RayStartError as err:
        say(f"orchard: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # between jobs
        return interrupts.exit_code(exc)
    return max(failures) if failures else 0
