"""Measured figures inside any Markdown file, written from the results files and from nothing else.

A figure in prose is a marker pair around its value; `python -m bench --render` rewrites the value:

    orchard is <!-- fig forest.json "today: orchard vs LightGBM rf" ratio -->1.60x<!-- /fig --> faster

The marker names a results file (in docs/benchmarks/results/, or docs/records/ for records such as
the CI's test-suite time), a row (a bench row's name; records have none: "-") and a field:

    ratio                 orchard's speed as a multiple of the peer's: "1.60x"
    orchard | peer        that side's median with the row's unit: "405 s"
    orchard.min | ...max  one end of that side's spread
    n                     the repeats behind the row
    verdict               what the row decides about its target: "met", "not met", "not decided (n=1)"
    quality.<side>.<key>  a quality figure of one side: "quality.orchard.class acc"
    <key>                 for records: a key (a dotted path), formatted by its name (`*_s` as minutes,
                          not `*_per_s`), whole numbers as counts

Why markers rather than prose typed by hand: the figures in README and docs/ drifted from the files
they came from (the issue lists eight); a test re-renders every marker and fails on a difference, so a
new results file either updates the prose or fails CI. Figures that cannot be generated (a profile
taken by hand, the thesis's own numbers) are cited instead, "(results/<file>.json, <row>)", or live in
a benchmark page's notes, which say when they were taken.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from bench.render import fmt, verdict

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "docs" / "benchmarks" / "results", ROOT / "docs" / "records")
# results files whose provenance cannot be traced (a tree with uncommitted changes, a commit outside
# this history): kept as notes, which a page may quote only as notes; never checked as results
NOTES = ROOT / "docs" / "benchmarks" / "notes"
MARKER = re.compile(r"<!-- fig (?P<spec>.+?) -->(?P<value>.*?)<!-- /fig -->", re.S)


class FigureError(ValueError):
    """A marker that names a file, row or field that does not exist."""


def markdown_files(root: Path = ROOT) -> list[Path]:
    """Every Markdown file a reader sees: README and docs/ (the generated benchmarks.md aside)."""
    docs = sorted(p for p in (root / "docs").rglob("*.md") if p.name != "benchmarks.md")
    return [root / "README.md", *docs]


def load(name: str) -> dict:
    for folder in (*SOURCES, NOTES):
        if (folder / name).exists():
            return json.loads((folder / name).read_text())
    raise FigureError(f"no results file or record named {name!r} in {', '.join(str(s) for s in SOURCES)}")


def field_value(result: dict, row_name: str, field: str) -> str:
    if row_name == "-":  # a record: one flat object
        v = result
        for part in field.split("."):  # "measured_utc.tests_s": when that figure was taken
            if not isinstance(v, dict) or part not in v:
                raise FigureError(f"record has no key {field!r}; keys: {', '.join(result)}")
            v = v[part]
        if field.startswith("measured_utc."):
            return str(v)[:10]
        if field.startswith("commits."):
            return str(v)[:10]
        if field.endswith("_s") and not field.endswith("_per_s") and isinstance(v, (int, float)):
            return f"{int(v // 60)} min {round(v % 60)} s" if v >= 60 else f"{v:.0f} s"
        if isinstance(v, float) and v.is_integer() and abs(v) < 1000:  # counts stored as floats: "3 trees"
            return str(int(v))
        return fmt(v) if isinstance(v, float) else str(v)
    rows = {r["name"]: r for r in result["rows"]}
    if row_name not in rows:
        raise FigureError(f"no row {row_name!r}; rows: {'; '.join(rows)}")
    row = rows[row_name]
    if field == "ratio":
        return f"{fmt(row['ratio'])}x"
    if field == "verdict":
        return verdict(row, result)
    if field == "n":
        return str(len(row["orchard"]["values"]))
    side, _, stat = field.partition(".")
    if side in ("orchard", "peer") and stat in ("", "min", "max"):
        return f"{fmt(row[side]['median' if not stat else stat])} {row['unit']}"
    if side == "quality":
        who, _, key = stat.partition(".")
        q = (row.get("quality") or {}).get(who) or {}
        if key not in q:
            raise FigureError(f"row {row_name!r} has no quality {who}.{key}; keys: {', '.join(q)}")
        v = q[key]
        if isinstance(v, float) and v.is_integer():  # counts stored as floats: "5 epochs", not "5.00"
            return str(int(v))
        return fmt(v) if isinstance(v, float) else str(v)
    raise FigureError(f"unknown field {field!r}")


def render_text(text: str, where: str) -> str:
    def one(m: re.Match) -> str:
        try:
            name, row, field = shlex.split(m["spec"])
        except ValueError:
            raise FigureError(f"{where}: marker '{m['spec']}' is not: FILE \"ROW\" FIELD") from None
        try:
            value = field_value(load(name), row, field)
        except FigureError as e:
            raise FigureError(f"{where}: {name}: {e}") from None
        return f"<!-- fig {m['spec']} -->{value}<!-- /fig -->"
    return MARKER.sub(one, text)


def render_all(root: Path = ROOT, write: bool = True) -> list[Path]:
    """Re-render every marker; returns the files whose text changed (written when `write`)."""
    changed = []
    for path in markdown_files(root):
        text = path.read_text()
        new = render_text(text, str(path.relative_to(root)))
        if new != text:
            changed.append(path)
            if write:
                path.write_text(new)
    return changed


def provenance_problems(root: Path = ROOT) -> list[str]:
    """Results files whose figures cannot be traced: a commit not in this history, or a dirty tree."""
    problems = []
    for path in sorted(p for folder in SOURCES for p in folder.glob("*.json")):
        data = json.loads(path.read_text())
        rel = path.relative_to(root)
        # a bench result names one commit; a record one per figure (each measured on its own day)
        m = data.get("machine") or {}
        commits = {m.get("git_commit")} if "machine" in data else set(data.get("commits", {}).values())
        if not commits or None in commits:
            problems.append(f"{rel}: no git commit recorded")
        for commit in sorted(c for c in commits if c):
            known = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=root,
                                   capture_output=True, check=False).returncode == 0
            if not known:
                problems.append(f"{rel}: commit {commit[:10]} is not in this history")
        if m.get("git_dirty") or data.get("git_dirty"):
            problems.append(f"{rel}: measured on a tree with uncommitted changes")
    return problems
