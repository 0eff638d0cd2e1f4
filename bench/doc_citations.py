"""Figures typed by hand in README and docs/: found, and each one's source checked.

A measured figure (seconds, images/s, MB, a ratio, an accuracy, a percentage, a line count) in
README.md or docs/**/*.md is either a marker that `python -m bench --render` fills from a results
file (bench/doc_figures.py) or carries a citation in its block: its paragraph, list item or table
row (a table's caption, the paragraph just above the table, covers every row). Four kinds:

    (results/flower.json, commit 894215a, 2026-11-26, load 0.96)  a measurement: the file that holds
                                                                  it, the commit measured, the date,
                                                                  the load average (or idle/unknown)
    (note, commit ae2dac4, 2026-11-21, load idle)                 a note taken by hand: the commit that
                                                                  recorded it, its date and load
    (paper: flower, Table 5.2)                                    a figure of a seed paper: the
                                                                  workload's document in docs/papers.md
                                                                  and where in it
    (set: conf/workload/flower.yaml)                              not a measurement but a setting, a
                                                                  limit or a target: the file that sets it
    (model: T(N) = S + W / N, the inputs above)                   not a measurement but a figure
                                                                  computed (a count, a model's output):
                                                                  how, in words

A path is relative to the repository, to docs/ or to docs/benchmarks/ (`results/x.json`,
`notes/x.json`, `records/x.json`). tests/test_docs.py fails on a figure with neither marker nor
citation (`uncited_figures`) and on a citation whose file, commit or paper does not exist
(`citation_problems`). Code blocks (but their comments) and inline code are not prose (commands,
config values, captured consoles) and are not scanned; ALLOWED lists the few figures that are facts, not
measurements, and why.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.doc_figures import MARKER, ROOT, markdown_files

UNIT = (r"(?:ms|us|s|min|h|hours?|minutes?|seconds?|[KMGT]i?B(?:/s)?|"
        r"(?:images|img|samples|examples|frames|tiles|pixels|rows|steps|trees|clips|videos)/s|%|lines)")
# a number and its unit ("0.16 s", "49.5 images/s", "97.8%", "450 lines") or a ratio ("1.63x": the
# "x" glued to its number; "1280x720" and "3 x 4" are not ratios)
FIGURE = re.compile(rf"(?<![\w.\-/])~?\d[\d,]*(?:\.\d+)?(?:x(?![\w/])|\s?{UNIT}(?![\w/]))")
# a quality figure named before its value ("MAE 0.47", "test accuracy 0.936", "top-1 of 0.6")
QUALITY = re.compile(r"\b(?:MAE|RMSE|accuracy|acc|top-1|F1)\b[^\d\n|()]{0,12}?(?<![\w.])(\d*\.\d+)")
CITATION = re.compile(r"\((?P<file>[\w./-]+),\s+commit\s+(?P<sha>[0-9a-f]{7,40}),\s+(?P<date>\d{4}-\d{2}-\d{2})"
                      r"[^,()]*,\s+load\s+(?P<load>[^()]+?)\)")
PAPER = re.compile(r"\(paper:\s+(?P<workload>\w+),\s+(?P<where>[^()]+)\)")
SETTING = re.compile(r"\(set:\s+(?P<file>[\w./-]+)(?:,\s+[^()]+)?\)")
MODEL = re.compile(r"\(model:\s[^()]+\)")
CITES = (CITATION, PAPER, SETTING, MODEL)
# a region a generator writes and a test keeps equal to its source (docs/scaling.md's fitted model)
GENERATED = re.compile(r"<!-- (?P<name>[a-z ]+?)(?:: [^>]*)? -->.*?<!-- /(?P=name) -->", re.S)
COMMENT = re.compile(r"(?<!\S)#\s.*")
# a bound, not a measurement: "target >= 5,000 images/s", "< 2 s" (the figure right after a comparison),
# and a target named in a heading or a column: "time to 97%", "first 97%"
BOUND = re.compile(r"(?:[<>]=?|[≥≤]|\btime to|\bfirst)\s*$")

# Figures that are facts rather than measurements and have no file to cite: (page, the words
# around the figure as the page has them, why). Keep it short: a figure that was measured is cited.
ALLOWED = (
    ("README.md", "every module of 60 lines or more", "the rule the test layout follows, not a measure"),
    ("docs/singa.md", "in under 20 lines", "the size of the example printed right below it"),
    ("docs/video.md", "once 10 s have passed", "Ray Data's own scale-down debounce (Ray 2.60), not orchard's"),
)


@dataclass(frozen=True)
class Figure:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def prose(text: str) -> str:
    """The page with code, markers and comments blanked (same line numbers)."""
    keep_lines = lambda m: "\n" * m[0].count("\n")  # noqa: E731
    # a code block is commands, configs and consoles; only its comments are prose ("# ~30 s")
    text = re.sub(r"^```.*?^```", lambda m: "\n".join(c[0] if (c := COMMENT.search(line)) else ""
                                                     for line in m[0].split("\n")), text, flags=re.S | re.M)
    text = MARKER.sub(lambda m: " " + keep_lines(m), text)
    text = GENERATED.sub(keep_lines, text)
    text = re.sub(r"<!--.*?-->", keep_lines, text, flags=re.S)
    # inline code may wrap onto the next line, never across a blank one
    return re.sub(r"`(?:[^`\n]|\n(?![ \t]*\n))*`", lambda m: "\n".join("``" for _ in m[0].split("\n")), text)


def blocks(text: str) -> list[tuple[int, str, str]]:
    """(first line, text, caption) of each paragraph, list item and table row; a row's caption is
    the paragraph just above its table."""
    out, current, start, caption, last_para = [], [], 0, "", ""
    in_table = False

    def flush():
        nonlocal current
        if current:
            out.append((start, "\n".join(current), caption if in_table else ""))
        current = []

    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        is_row = stripped.startswith("|")
        if not stripped or is_row or re.match(r"(#+ |[-*] |\d+\. )", stripped):
            flush()
            if is_row and not in_table:
                caption = last_para
            in_table = is_row
            if not stripped:
                continue
            start = i
        elif in_table:  # a line after a table without a blank line starts a paragraph
            in_table = False
            start = i
        elif not current:
            start = i
        current.append(line)
        if not is_row:
            last_para = "\n".join(current)
    flush()
    return out


def cited(block: str) -> bool:
    return any(c.search(block) for c in CITES)


def allowed(page: str, line: str, figure: str) -> bool:
    return any(p == page and words in line and figure.strip() in words for p, words, _ in ALLOWED)


def figures_in(page: str, text: str) -> list[Figure]:
    """The figures of one page (`page` as README.md or docs/...) outside markers, code and cited blocks."""
    found = []
    for line, block, caption in blocks(prose(text)):
        if cited(block) or cited(caption):
            continue
        # the whole block at once: a figure may wrap ("under 10\nminutes")
        for m in (*FIGURE.finditer(block), *QUALITY.finditer(block)):
            words = block[block.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
            if not allowed(page, words, m[0]) and not BOUND.search(block, 0, m.start()):
                found.append(Figure(page, line + block.count("\n", 0, m.start()), " ".join(m[0].split())))
    return found


def uncited_figures(root: Path = ROOT) -> list[Figure]:
    """Every figure in README and docs/ with neither a marker nor a citation."""
    return [f for path in markdown_files(root) for f in figures_in(str(path.relative_to(root)), path.read_text())]


def resolve(root: Path, name: str) -> Path | None:
    for folder in (root, root / "docs", root / "docs" / "benchmarks"):
        if (folder / name).exists():
            return folder / name
    return None


def papers(root: Path = ROOT) -> set[str]:
    """The workloads whose document docs/papers.md's table names."""
    table = (root / "docs" / "papers.md").read_text()
    return set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M))


def known_commits(shas: set[str], root: Path = ROOT) -> set[str]:
    """The abbreviated commits that name a commit of this repository (one git call)."""
    if not shas:
        return set()
    order = sorted(shas)
    out = subprocess.run(["git", "cat-file", "--batch-check"], cwd=root, check=False, capture_output=True,
                         text=True, input="".join(f"{s}^{{commit}}\n" for s in order)).stdout.splitlines()
    return {s for s, line in zip(order, out) if line.endswith(" commit") or " commit " in line}


def citation_problems_in(page: str, text: str, root: Path = ROOT) -> list[str]:
    """One page's citations whose file, commit or paper does not exist."""
    text = prose(text)
    where = lambda m: f"{page}:{text.count(chr(10), 0, m.start()) + 1}"  # noqa: E731
    problems, commits = [], []
    for m in CITATION.finditer(text):
        if m["file"] != "note" and resolve(root, m["file"]) is None:
            problems.append(f"{where(m)}: no file {m['file']!r}")
        commits.append((where(m), m["sha"]))
    problems += [f"{where(m)}: no file {m['file']!r}" for m in SETTING.finditer(text) if resolve(root, m["file"]) is None]
    workloads = papers(root)
    problems += [f"{where(m)}: docs/papers.md names no document for {m['workload']!r}"
                 for m in PAPER.finditer(text) if m["workload"] not in workloads]
    known = known_commits({sha for _, sha in commits}, root)
    return problems + [f"{at}: commit {sha} is not in this repository" for at, sha in commits if sha not in known]


def citation_problems(root: Path = ROOT) -> list[str]:
    """Every citation in README and docs/ whose file, commit or paper does not exist."""
    return [p for path in markdown_files(root)
            for p in citation_problems_in(str(path.relative_to(root)), path.read_text(), root)]


if __name__ == "__main__":  # python -m bench.doc_citations: the figures still without a source
    for figure in uncited_figures():
        print(figure)
    for problem in citation_problems():
        print(problem)
