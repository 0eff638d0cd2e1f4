"""Keep Ray's own chatter off the console so orchard's progress line and summary stay readable.

At ``cluster.ray_log_level=WARNING`` (the default) these INFO lines leave the console (they
still reach the session's log files under /tmp/ray/session_*/logs):
- Ray Train: worker-group start, "Moving model to device", "Setting up process group",
  "Reporting training result ..." once per report per worker;
- Ray Data: "Starting execution of Dataset ..." / "execution finished" per dataset (its own
  logging config, ``ray_data_logging.yaml``, read through ``RAY_DATA_LOGGING_CONFIG``).
And two WARNINGs go at every level: Ray's token-auth notice at every start (auth itself stays
on), and Ray Train's placement-group cleaner asks the State API
(served by the dashboard) once a second whether the controller lives, and warns each time the
dashboard is off, which orchard's embedded Ray is by default.  Ray frees the placement groups
when the embedded session ends anyway.

Ray Train 2.60 ignores ``RunConfig(logging_config=...)`` on the workers, and a filter on a
logger is the one setting its logging setup does not replace, so the quieting is a filter
per logger, installed in every worker process by ``runtime_env["worker_process_setup_hook"]``
(an embedded Ray's workers get the hook, as its other variables, from the environment they
inherit: ``orchard.cluster._as_environment``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from orchard.cluster.ray_private import (TOKEN_SETUP_LOGGER, TRAIN_CHATTY_LOGGERS, TRAIN_PG_CLEANER_LOGGER,
                                 reconfigure_data_logging)
from orchard.config.levels import LIBRARY_LOG_LEVELS

RAY_DATA_LOGGING = Path(__file__).resolve().parent / "ray_data_logging.yaml"
LEVEL_ENV = "ORCHARD_RAY_LOG_LEVEL"
SETUP_HOOK = "orchard.cluster.ray_logging.install_filters"

# Loggers whose INFO records are chatter for an orchard user.
CHATTY = (*TRAIN_CHATTY_LOGGERS, "ray.train.torch.config", "ray.train.torch.train_loop_utils")
PG_CLEANER = TRAIN_PG_CLEANER_LOGGER


class _MinLevel(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


class _NoStateApiNagging(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to query Ray Train Controller actor state" not in record.getMessage()


class _NoTokenAuthNotice(logging.Filter):
    """Ray's token auth stays on (even an embedded Ray listens on every interface, and the token
    keeps other hosts out); only its every-start notice, which suggests turning it off, goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Token authentication is enabled" not in record.getMessage()


TOKEN_SETUP = TOKEN_SETUP_LOGGER


def _chatty_loggers() -> list[str]:
    import ray

    # Ray Train 2.60 names the reporting logger after its file, not its module.
    context_file = Path(ray.__file__).parent / "train" / "v2" / "_internal" / "execution" / "context.py"
    return [*CHATTY, str(context_file)]


def _keep_data_logging_config() -> None:
    """Point ``RAY_DATA_LOGGING_CONFIG`` at a copy that outlives the job's working_dir.

    The shipped copy names the file relative to the working_dir, which Ray Data opens when a
    worker first imports it: a worker started before a lost node and used after it found that
    folder gone, and every Ray Data actor it hosted failed to import (docs/cluster.md, "Losing
    nodes"). So each worker copies it now into this user's private temp folder (0700: a logging
    config can name classes to build, so never one another user could plant)."""
    import hashlib

    name = os.environ.get("RAY_DATA_LOGGING_CONFIG")
    if not name or os.path.isabs(name):
        return
    try:
        from orchard.storage.private_tmp import private_tmp

        text = Path(name).read_bytes() if os.path.exists(name) else RAY_DATA_LOGGING.read_bytes()
        kept = private_tmp() / f"ray_data_logging-{hashlib.sha256(text).hexdigest()[:16]}.yaml"
        if not kept.exists():
            part = kept.with_suffix(f".{os.getpid()}.part")
            part.write_bytes(text)
            os.replace(part, kept)
        os.environ["RAY_DATA_LOGGING_CONFIG"] = str(kept)
    except OSError:  # nowhere to keep it: as before
        pass


def install_filters() -> None:
    """Run in every Ray worker process (and the driver): add the filters once."""
    _keep_data_logging_config()
    level = getattr(logging, os.environ.get(LEVEL_ENV, "WARNING").upper(), logging.WARNING)
    for name in _chatty_loggers():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _MinLevel) for f in logger.filters):
            logger.addFilter(_MinLevel(level))
    token = logging.getLogger(TOKEN_SETUP)
    if not any(isinstance(f, _NoTokenAuthNotice) for f in token.filters):
        token.addFilter(_NoTokenAuthNotice())
    cleaner = logging.getLogger(PG_CLEANER)
    if not any(isinstance(f, _NoStateApiNagging) for f in cleaner.filters):
        cleaner.addFilter(_NoStateApiNagging())


def quiet(level: str, runtime_env: dict, where: str) -> dict:
    """Quiet this process and return ``runtime_env`` extended for the workers.

    ``where``: ``local`` (workers import this checkout), ``shipped`` (a remote cluster's
    workers run in the shipped checkout), ``modules`` (Ray Client: orchard travels as
    py_modules, so no file of the checkout has a path the workers know) or ``foreign`` (a
    user's working_dir: orchard may not be importable there, so only the level travels)."""
    level = level.upper()
    worker_env = {LEVEL_ENV: level}
    os.environ.setdefault(LEVEL_ENV, level)
    quiet_data = LIBRARY_LOG_LEVELS.index(level) >= LIBRARY_LOG_LEVELS.index("WARNING")
    if quiet_data:
        os.environ.setdefault("RAY_DATA_LOGGING_CONFIG", str(RAY_DATA_LOGGING))
        if "ray.data" in sys.modules:
            # ray.data configured its logger when it was first imported: apply ours now.
            with contextlib.suppress(Exception):
                reconfigure_data_logging()
    install_filters()
    out = dict(runtime_env)
    if where != "foreign":
        if quiet_data and where != "modules":
            worker_env["RAY_DATA_LOGGING_CONFIG"] = ("orchard/cluster/ray_data_logging.yaml" if where == "shipped"
                                                     else str(RAY_DATA_LOGGING))
        out.setdefault("worker_process_setup_hook", SETUP_HOOK)
    out["env_vars"] = {**worker_env, **(runtime_env.get("env_vars") or {})}
    return out
