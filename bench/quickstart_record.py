"""README's own timings, measured: a fresh clone, its install, its first command and its test suite.

    python -m bench.quickstart_record                 # ~35 min: clone, .ci/run (install + tests), the flower run
    python -m bench.quickstart_record --ci-runs 2     # ~70 min: two fresh clones' .ci/run in a row (the slower one is the record)
    python -m bench.quickstart_record --no-tests      # ~5 min: clone, install, the flower run
    python -m bench.quickstart_record --from-log LOG --commit SHA [--load B,A]   # record a finished `.ci/run` log
    python -m bench.quickstart_record --keep-log /tmp/quickstart.log  # and keep the whole log

Writes docs/records/quickstart.json (keys: install_s, first_command_s, tests_s, passed, skipped,
failed, ci_total_s, quick_loop_s (`python -m pytest -m "not slow"` in the last clone), ci_runs (each
fresh clone's .ci/run: seconds, exit, load before and after), the commit, the load before and after). README's figures are markers over these keys
(bench/doc_figures.py), so `python -m bench --render` carries a new record into the prose. Run it on
an idle machine: the load is recorded beside the figures and a loaded record says so.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import committed_head

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "records" / "quickstart.json"
FIRST_COMMAND = ["python", "-m", "orchard", "workload=flower", "strategy=ring"]
SUMMARY = re.compile(r"=+ (?P<body>.*?) in (?P<secs>[\d.]+)s")


def pytest_counts(log: str) -> dict:
    """passed / skipped / failed and pytest's own seconds from the last summary line of a log."""
    lines = [m for m in SUMMARY.finditer(log) if "passed" in m["body"] or "failed" in m["body"]]
    if not lines:
        raise SystemExit("quickstart_record: no pytest summary line in the log")
    last = lines[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|skipped|failed|error)", last["body"])}
    return {"passed": counts.get("passed", 0), "skipped": counts.get("skipped", 0),
            "failed": counts.get("failed", 0) + counts.get("error", 0), "tests_s": float(last["secs"])}


CI_LINE = re.compile(r"^ci: (?P<total>\d+) s in all: install (?P<install>\d+) s, tests \d+ s \(exit (?P<rc>\d+)\)", re.M)


def ci_line(log: str) -> dict:
    """``ci_total_s``, ``install_s`` and ``ci_exit`` from the last line `.ci/run` prints, if the log has it."""
    found = list(CI_LINE.finditer(log))
    if not found:
        return {}
    last = found[-1]
    return {"ci_total_s": float(last["total"]), "install_s": float(last["install"]), "ci_exit": int(last["rc"])}


def timed(cmd: list[str], cwd: Path, env: dict, log) -> tuple[int, float]:
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    return rc, time.monotonic() - t0


QUICK_LOOP = ["python", "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider"]


def ci_run(root: Path, env: dict, log) -> dict:
    """``bash .ci/run`` on a fresh clone of ``root``'s HEAD: its seconds, exit, counts and load."""
    load_before = os.getloadavg()[0]
    rc, total = timed(["bash", ".ci/run"], root, env, log)
    log.seek(0)
    counts = pytest_counts(log.read())
    return {**counts, "ci_exit": rc, "ci_total_s": total, "load_before": load_before, "load_after": os.getloadavg()[0]}


def measure(tests: bool, keep_log: str | None = None, ci_runs: int = 1) -> dict:
    commit = committed_head("quickstart_record")
    out: dict = {"git_commit": commit, "git_dirty": False, "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="orchard-quickstart-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
        env["CI"] = "true"
        runs = []
        for i in range(ci_runs if tests else 0):  # .ci/run: the README's install, then its test command
            clone = Path(tmp) / f"orchard-{i}"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            # the commit recorded, whatever HEAD has become since the first run began
            subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
            with open(Path(tmp) / f"ci-{i}.log", "w+") as log:
                runs.append(ci_run(clone, env, log))
            print(f"quickstart_record: .ci/run {i + 1} of {ci_runs}: {runs[-1]['ci_total_s']:.0f} s, "
                  f"exit {runs[-1]['ci_exit']}, load {runs[-1]['load_before']:.2f} -> {runs[-1]['load_after']:.2f}", flush=True)
        if runs:  # the record is the slowest run (and any failure), every run listed beside it
            worst = max(runs, key=lambda r: (r["ci_exit"] != 0 or r["failed"] > 0, r["ci_total_s"]))
            out.update({k: v for k, v in worst.items() if k not in ("load_before", "load_after")}, ci_runs=runs)
            venv = clone / ".venv-ci"
            env_venv = {**env, "PATH": f"{venv}/bin:{env['PATH']}"}
            with open(Path(tmp) / "quick.log", "w+") as log:
                rc, quick = timed(QUICK_LOOP, clone, env_venv, log)
            out.update(quick_loop_s=quick, quick_loop_exit=rc)
        else:
            clone = Path(tmp) / "orchard"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            venv = clone / ".venv"
            with open(Path(tmp) / "install.log", "w+") as log:
                rc, out["install_s"] = timed(["bash", "-c", f"python3 -m venv {venv} && {venv}/bin/pip install -q -e '.[dev]'"],
                                             clone, env, log)
            if rc:
                raise SystemExit(f"quickstart_record: the install failed (exit {rc}); log: {log.name}")
        env["PATH"] = f"{venv}/bin:{env['PATH']}"
        with open(Path(tmp) / "first.log", "w+") as log:
            rc, out["first_command_s"] = timed(FIRST_COMMAND, clone, env, log)
            out["first_command_exit"] = rc
        if keep_log:  # the clones go with the temporary folder; the logs stay where asked
            Path(keep_log).write_text("".join(p.read_text() for p in sorted(Path(tmp).glob("*.log"))))
    out["load_after"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quickstart_record", description=__doc__.splitlines()[0])
    ap.add_argument("--no-tests", action="store_true", help="install and first command only")
    ap.add_argument("--ci-runs", type=int, default=1, help="fresh clones' .ci/run in a row (the slowest is recorded)")
    ap.add_argument("--from-log", help="a finished `bash .ci/run` log to record instead of running")
    ap.add_argument("--commit", help="with --from-log: the commit the log's fresh clone was at")
    ap.add_argument("--when", help="with --from-log: when that run ended (UTC, ISO 8601; default: the log's last write)")
    ap.add_argument("--load", help="with --from-log: the 1-minute load average before and after that run, e.g. 1.23,6.22")
    ap.add_argument("--keep-log", help="also write the whole log (install, tests, first command) to this file")
    args = ap.parse_args(argv)
    old = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    if args.from_log:
        if not args.commit:
            raise SystemExit("quickstart_record: --from-log needs --commit (the record names what was tested)")
        log = Path(args.from_log).read_text()
        new = {"git_commit": args.commit, "git_dirty": False, **pytest_counts(log), **ci_line(log)}
        if args.load:  # a figure without its load is not a figure (README, "Benchmarks")
            new["load_before"], new["load_after"] = (float(x) for x in args.load.split(","))
        # the run ended when its log was last written (a record's every figure has its date)
        when = args.when or dt.datetime.fromtimestamp(Path(args.from_log).stat().st_mtime,
                                                      dt.timezone.utc).isoformat(timespec="seconds")
    else:
        new = measure(tests=not args.no_tests, keep_log=args.keep_log, ci_runs=args.ci_runs)
        when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    # a partial measurement keeps the other figures of the last one, each with its own date
    figures = {k: v for k, v in new.items() if k not in ("git_commit", "git_dirty")}
    record = {**old, **figures,
              "measured_utc": {**old.get("measured_utc", {}), **{k: when for k in figures}},
              "commits": {**old.get("commits", {}), **{k: new["git_commit"] for k in figures}}}
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"quickstart_record: wrote {RECORD}: " + ", ".join(f"{k}={v}" for k, v in new.items() if not isinstance(v, (dict, list))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
