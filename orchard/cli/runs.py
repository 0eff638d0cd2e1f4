"""``python -m orchard runs list|show|compare|reap``: the store's runs from the command line.

    runs list [workload=NAME] [status=FINISHED|FAILED|KILLED|RUNNING] [limit=N]
        every run, newest first: id, status, workload/strategy, headline, duration, name; a
        RUNNING run says whether its driver is alive or lost (orchard/tracking/lost_runs.py)
    runs show ID           one run again: its description, headline, error, metrics, folder, UI link
    runs compare ID ID ... the runs side by side: headline, the parameters that differ, metrics
    runs reap              close runs whose driver died (SIGKILL, OOM) as FAILED "driver lost"

Each takes ``tracking.uri=...`` (default ``sqlite:///mlflow.db``, as a run's) and never creates a
store where there is none. An ID may be shortened to a unique prefix, as listings show it. The
MLflow UI has the charts; these answer "what did I run, which was best" without a browser.
"""
from __future__ import annotations

import sys

from orchard.errors import ConfigError
from orchard.terminal.console import say

USAGE = ("usage: python -m orchard runs list [workload=NAME] [status=FINISHED|FAILED|KILLED|RUNNING] [limit=N]\n"
         "       python -m orchard runs show <run id>\n"
         "       python -m orchard runs compare <run id> <run id> [...] [metrics=all]\n"
         "       python -m orchard runs reap\n"
         "  each with [tracking.uri=sqlite:///mlflow.db]")
STATUSES = ("FINISHED", "FAILED", "KILLED", "RUNNING", "SCHEDULED")
LIST_LIMIT = 20  # a screenful; limit=0 lists them all
# what a comparison shows first, in this order (metrics=all adds the rest): the answer, then how
# it was reached
COMPARED = ("headline/", "test/", "val/", "train/loss", "train/accuracy", "time/total_s", "throughput/mean")
# parameters that differ between any two runs and say nothing about what was trained
NOT_COMPARED = ("run_name", "output_dir", "tracking.", "hydra.", "cluster.address")


def runs_command(argv: list[str]) -> int:
    """The ``runs`` verbs; exit 0, or 2 with one line for a bad argument or a missing store."""
    from mlflow.tracking import MlflowClient

    from orchard.tracking.store import DEFAULT_URI, check_store, resolve_uri

    if not argv or argv[0] not in ("list", "show", "compare", "reap"):
        say(USAGE, file=sys.stderr)
        return 2
    verb, ids, keys = argv[0], [], {}
    for arg in argv[1:]:
        if "=" in arg:
            key, value = arg.split("=", 1)
            keys[key] = value
        else:
            ids.append(arg)
    uri = keys.pop("tracking.uri", DEFAULT_URI)
    try:
        options = _options(verb, ids, keys)
        check_store(uri, create=False)  # listing a store that is not there never makes one
    except ConfigError as err:
        say(f"orchard runs: {err}", file=sys.stderr)
        return 2
    client = MlflowClient(resolve_uri(uri))
    try:
        if verb == "reap":
            return _reap(client)
        if verb == "list":
            return _list(client, uri, **options)
        found = [_find(client, run_id, uri) for run_id in ids]
    except ConfigError as err:
        say(f"orchard runs: {err}", file=sys.stderr)
        return 2
    if verb == "show":
        return _show(client, found[0])
    return _compare(found, **options)


def _options(verb: str, ids: list[str], keys: dict) -> dict:
    """The verb's options from ``key=value`` arguments and run ids, or a ConfigError naming the key."""
    allowed = {"list": ("workload", "status", "limit"), "compare": ("metrics",)}.get(verb, ())
    for key in keys:
        if key not in allowed:
            raise ConfigError(key, f"one of {', '.join(allowed + ('tracking.uri',))} for `runs {verb}`")
    wanted_ids = {"show": (1, 1), "compare": (2, 50)}.get(verb, (0, 0))
    if not wanted_ids[0] <= len(ids) <= wanted_ids[1]:
        what = {(0, 0): "no run id", (1, 1): "one run id", (2, 50): "two run ids or more"}[wanted_ids]
        raise ConfigError("run id", f"{what} for `runs {verb}`; got {len(ids)}: {' '.join(ids) or '-'}")
    if verb == "list":
        status = keys.get("status", "").upper()
        if status and status not in STATUSES:
            raise ConfigError("status", f"one of {', '.join(STATUSES)}; {keys['status']!r} is not one")
        limit = keys.get("limit", str(LIST_LIMIT))
        if not limit.isdigit():
            raise ConfigError("limit", f"a whole number of runs (0: all); {limit!r} is not one")
        return {"workload": keys.get("workload"), "status": status or None, "limit": int(limit)}
    if verb == "compare":
        if keys.get("metrics", "main") not in ("main", "all"):
            raise ConfigError("metrics", f"main or all; {keys['metrics']!r} is not one")
        return {"every_metric": keys.get("metrics") == "all"}
    return {}


def _find(client, run_id: str, uri: str):
    from orchard.tracking.lost_runs import find_run_by_prefix

    try:
        return client.get_run(run_id)
    except Exception:  # not a whole id of this store: a prefix of one, or a ConfigError naming it
        return find_run_by_prefix(client, run_id, uri)


# --------------------------------------------------------------------------- list
def _list(client, uri: str, workload: str | None, status: str | None, limit: int) -> int:
    from orchard.tracking.lost_runs import all_runs, store_now, why_lost

    filters = []
    if workload:
        filters.append(f"tags.`orchard.workload` = '{workload.replace(chr(39), '')}'")
    if status:
        filters.append(f"attributes.status = '{status}'")
    found = sorted(all_runs(client, " and ".join(filters)), key=lambda r: r.info.start_time or 0, reverse=True)
    if not found:  # an empty listing would look like a command that did nothing
        which = " ".join(f for f in (status, workload) if f)
        say(f"orchard: no {which + ' ' if which else ''}runs in {uri}")
        return 0
    now = store_now(client.tracking_uri) if any(r.info.status == "RUNNING" for r in found) else None
    shown = found[:limit] if limit else found
    rows = [("run", "status", "workload", "headline", "took", "name")]
    for run in shown:
        tags = run.data.tags
        state = run.info.status
        if state == "RUNNING":  # its driver alive, or lost (SIGKILL, OOM) and waiting for a reaper
            alive = f"alive (pid {tags.get('orchard.pid', '?')} on {tags.get('orchard.host', '?')})"
            state = f"RUNNING, {why_lost(tags, now) or alive}"
        kind = _kind(run) or "-"
        if "mlflow.parentRunId" in tags:
            kind += " (trial)"
        elif tags.get("orchard.sweep"):
            kind += " (sweep)"
        rows.append((run.info.run_id, state, kind, _headline(run) or "-", _took(run), tags.get("mlflow.runName", "")))
    say(_table(rows))
    if len(found) > len(shown):
        say(f"({len(found) - len(shown)} older run(s) not shown: limit=0 lists them all)")
    return 0


def _headline(run) -> str:
    from orchard.tracking.summary import HEADLINE_PREFIX, num

    return ", ".join(f"{k[len(HEADLINE_PREFIX):]} {num(v)}" for k, v in sorted(run.data.metrics.items())
                     if k.startswith(HEADLINE_PREFIX))


def _kind(run) -> str:
    """``workload/strategy`` as orchard tagged the run; empty for a run orchard did not make."""
    tags = run.data.tags
    return "/".join(t for t in (tags.get("orchard.workload"), tags.get("orchard.strategy")) if t)


def _took(run) -> str:
    if not run.info.end_time or not run.info.start_time:
        return "-"
    seconds = (run.info.end_time - run.info.start_time) / 1000
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds // 60:.0f} min {seconds % 60:.0f} s"


def _table(rows: list[tuple]) -> str:
    """Columns padded to their widest cell, the last one left ragged."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(str(c).ljust(w) for c, w in zip(row, widths)), str(row[-1])]).rstrip()
                     for row in rows)


# --------------------------------------------------------------------------- show
def _show(client, run) -> int:
    from orchard.tracking.summary import num, view_lines

    tags, metrics = run.data.tags, run.data.metrics
    kind = _kind(run) or "run"
    lines = [f"orchard {kind}: {tags.get('mlflow.runName', run.info.run_id)}  {run.info.status} in {_took(run)}"]
    if tags.get("mlflow.note.content"):  # the UI renders it as markdown: its bold is no text for a terminal
        lines.append(f"  {tags['mlflow.note.content'].replace('**', '')}")
    if tags.get("orchard.error"):
        lines.append(f"error:     {tags['orchard.error'].splitlines()[0][:300]}")
    if tags.get("orchard.command"):
        lines.append(f"command:   {tags['orchard.command']}")
    main = [k for k in sorted(metrics) if k.startswith(COMPARED)]
    for key in main:
        lines.append(f"  {key:<34} {num(metrics[key])}")
    rest = len(metrics) - len(main)
    lines.append(f"run:       {run.info.run_id} (experiment {run.info.experiment_id}), {len(metrics)} metrics"
                 + (f" ({rest} more in the MLflow UI)" if rest else ""))
    if tags.get("orchard.run_dir"):
        lines.append(f"run dir:   {tags['orchard.run_dir']}")
    lines += view_lines(client.tracking_uri, run.info.experiment_id, run.info.run_id)
    say("\n".join(lines))
    return 0


# --------------------------------------------------------------------------- compare
def _compare(found: list, every_metric: bool) -> int:
    from orchard.tracking.summary import num

    names = [r.info.run_id[:12] for r in found]
    rows = [("", *names), ("status", *(r.info.status for r in found)),
            ("workload", *(_kind(r) or "-" for r in found)),
            ("took", *(_took(r) for r in found))]
    params = sorted({k for r in found for k in r.data.params})
    differing = [k for k in params if not k.startswith(NOT_COMPARED)
                 and len({r.data.params.get(k) for r in found}) > 1]
    rows += [(k, *(r.data.params.get(k, "-") for r in found)) for k in differing]
    keys = sorted({k for r in found for k in r.data.metrics})
    shown = keys if every_metric else [k for p in COMPARED for k in keys if k.startswith(p)]
    rows += [(k, *(num(r.data.metrics[k]) if k in r.data.metrics else "-" for r in found)) for k in shown]
    say(_table([(*row, "") for row in rows]))
    hidden = len(keys) - len(shown)
    if not differing:
        say("(the runs' parameters are the same)")
    if hidden:
        say(f"({hidden} more metric(s): metrics=all shows them)")
    return 0


# --------------------------------------------------------------------------- reap
def _reap(client) -> int:
    from orchard.tracking.lost_runs import reap

    closed = reap(client)
    say(f"orchard: closed {len(closed)} run(s) whose driver was lost" + (": " + ", ".join(closed) if closed else ""))
    return 0
