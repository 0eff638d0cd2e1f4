"""The figures in README and docs/ cannot drift: every marked figure re-renders to what the page
says, every other figure cites where it came from (and the cited file and commit exist), the
generated benchmark tables match their results files, and every results file names a commit of
this history measured on a clean tree; docs/architecture.md's tree is the tree."""
from __future__ import annotations

import json

import pytest

from bench.doc_citations import ALLOWED, citation_problems, citation_problems_in, figures_in, uncited_figures
from bench.doc_figures import FigureError, markdown_files, provenance_problems, render_all, render_text
from bench.render import render
from bench.rows import row, summarize
from bench.runner import RESULTS, ROOT


def test_every_marked_figure_in_readme_and_docs_is_what_its_results_file_says():
    stale = render_all(write=False)
    assert not stale, f"figures differ from the results files in {[str(p.relative_to(ROOT)) for p in stale]}: " \
                      "run `python -m bench --render`"
    # the markers are really used where the figures are quoted
    marked = [p for p in markdown_files() if "<!-- fig " in p.read_text()]
    assert ROOT / "README.md" in marked and ROOT / "docs" / "forest.md" in marked


def test_the_generated_benchmark_tables_match_the_results_files(tmp_path):
    fresh = render(RESULTS, tmp_path / "benchmarks.md")
    assert fresh == (ROOT / "docs" / "benchmarks.md").read_text(), "docs/benchmarks.md is stale: run `python -m bench --render`"


def test_every_results_file_names_a_commit_of_this_history_on_a_clean_tree():
    assert provenance_problems() == []


def test_every_hand_typed_figure_in_readme_and_docs_has_a_marker_or_a_citation():
    """A figure typed by hand (seconds, MB, images/s, 1.6x, 97%, an accuracy) outside a marker and
    code carries a citation in its block (bench/doc_citations.py; the forms: docs/benchmarks.md)."""
    uncited = uncited_figures()
    assert not uncited, ("figures with neither a marker nor a citation (make them markers, cite them as "
                         "docs/benchmarks.md says, or delete them):\n" + "\n".join(map(str, uncited)))


def test_every_citation_names_a_file_a_commit_and_a_paper_that_exist():
    assert citation_problems() == []


@pytest.mark.parametrize(("text", "flagged"), [
    ("A smoke run takes ~30 s on 2 cores.", ["~30 s"]),
    ("It moves 3.48 MB a step, 49.5 images/s, 1.63x the peer, test MAE 0.47.",
     ["3.48 MB", "49.5 images/s", "1.63x", "MAE 0.47"]),
    ("It moves 3.48 MB a step (results/singa.json, commit 0000000, 2026-11-24, load 0.94).", []),
    ('A step: <!-- fig flower.json "ring vs plain DDP, 1 worker, per step" orchard -->62.3 images/s<!-- /fig -->.', []),
    ("Waits 10 s (set: orchard/tracking/store.py); the thesis: 7.5x (paper: flower, 5.1.3).", []),
    ("A 1280x720 field, 3 x 4 tiles, `timeout_s: 600 s`, target >= 0.9x.", []),
    ("```bash\npython -m orchard workload=forest debug=smoke   # ~30 s\n```", ["~30 s"]),
    ("| run | time |\n| --- | --- |\n| ring | 221 s |", ["221 s"]),
    ("Runs timed by hand (note, commit 0000000, 2026-11-21, load idle):\n\n| run | time |\n| --- | --- |\n"
     "| ring | 221 s |", []),
])
def test_the_scanner_finds_a_new_hand_typed_figure_and_accepts_a_marked_or_cited_one(text, flagged):
    assert [f.text for f in figures_in("docs/page.md", text)] == flagged


def test_a_citation_of_a_missing_file_commit_or_paper_is_a_problem_naming_the_page():
    problems = citation_problems_in("docs/page.md", "\n".join([
        "a (results/nope.json, commit 894215a, 2026-11-26, load 0.96)",
        "b (results/flower.json, commit 0123456789abcdef, 2026-11-26, load 0.96)",
        "c (paper: nope, Table 1)",
        "d (set: conf/nope.yaml)",
        "e (note, commit 894215a, 2026-11-26, load idle) (results/flower.json, commit 894215a, 2026-11-26, load 0.96)",
    ]))
    assert problems == ["docs/page.md:1: no file 'results/nope.json'", "docs/page.md:4: no file 'conf/nope.yaml'",
                        "docs/page.md:3: docs/papers.md names no document for 'nope'",
                        "docs/page.md:2: commit 0123456789abcdef is not in this repository"]


def test_the_allow_list_stays_short_and_every_entry_is_on_its_page():
    assert len(ALLOWED) <= 5
    for page, words, why in ALLOWED:
        assert words in (ROOT / page).read_text() and why


def test_a_marker_naming_a_missing_row_or_field_is_an_error_naming_the_page():
    with pytest.raises(FigureError, match=r"page\.md: forest\.json: no row 'nope'"):
        render_text('<!-- fig forest.json "nope" ratio -->1x<!-- /fig -->', "page.md")
    with pytest.raises(FigureError, match="unknown field 'speed'"):
        render_text('<!-- fig forest.json "today: orchard vs LightGBM rf" speed -->1x<!-- /fig -->', "page.md")


def result_with(values_o: list[float], values_p: list[float]) -> dict:
    r = summarize(row("x", "s", values_o, values_p, orchard_label="o", peer_label="p", higher_is_better=False,
                      target={"text": "orchard no slower", "min_ratio": 1.0}))
    return {"smoke": False, "load": {"loaded": False}, "rows": [r]}


@pytest.mark.parametrize(("orchard", "peer", "says"), [
    ([10.0], [12.0], "not decided (n=1)"),                        # one repeat decides nothing
    ([10.0, 11.0, 13.0], [12.0, 12.5, 13.0], "not decided (spread"),  # the spreads cross 1.0x
    ([10.0, 10.5, 11.0], [12.0, 12.5, 13.0], ": met"),              # worst case 12/11 > 1
    ([14.0, 14.5, 15.0], [12.0, 12.5, 13.0], ": not met"),          # best case 13/14 < 1
])
def test_a_target_is_met_only_on_three_repeats_whose_spread_does_not_cross_it(tmp_path, orchard, peer, says):
    from bench.render import verdict

    res = result_with(orchard, peer)
    assert says in "orchard no slower: " + verdict(res["rows"][0], res).split(": ", 1)[1]


def test_a_record_figure_renders_minutes_and_its_date(tmp_path, monkeypatch):
    import bench.doc_figures as figs

    (tmp_path / "quickstart.json").write_text(json.dumps(
        {"tests_s": 3033.4, "passed": 567, "measured_utc": {"tests_s": "2026-11-25T12:30:46+00:00"}}))
    monkeypatch.setattr(figs, "SOURCES", (tmp_path,))
    text = render_text("<!-- fig quickstart.json - passed -->0<!-- /fig --> in <!-- fig quickstart.json - tests_s -->"
                       "?<!-- /fig --> (<!-- fig quickstart.json - measured_utc.tests_s -->?<!-- /fig -->)", "README.md")
    assert ">567<" in text and ">50 min 33 s<" in text and ">2026-11-25<" in text


def test_a_default_run_record_renders_rates_counts_and_nested_keys(tmp_path, monkeypatch):
    import bench.doc_figures as figs

    (tmp_path / "default_runs.json").write_text(json.dumps(
        {"forest": {"time_total_s": 203.3, "throughput_example_features_per_s": 1.89e8, "train_trees": 3.0,
                    "test_pixel_accuracy": 0.7217}}))
    monkeypatch.setattr(figs, "SOURCES", (tmp_path,))
    text = render_text(" ".join(f"<!-- fig default_runs.json - forest.{k} -->?<!-- /fig -->" for k in
                                ("time_total_s", "throughput_example_features_per_s", "train_trees",
                                 "test_pixel_accuracy")), "docs/benchmarks/forest.md")
    assert ">3 min 23 s<" in text and ">189,000,000<" in text and ">3<" in text and ">0.722<" in text


def test_the_architecture_tree_lists_every_core_file_and_only_files_that_exist():
    """docs/architecture.md's tree of orchard/ is the tree: each listed file exists under its
    folder, and every source file of the core is listed."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    tree = page.split("```\norchard/\n", 1)[1].split("```", 1)[0]
    listed, folders = set(), []
    for line in tree.splitlines():
        indent, name = len(line) - len(line.lstrip()), line.split()[0]
        folders = folders[: indent // 2 - 1]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif "." in name:
            listed.add("/".join(["orchard", *folders, name]))
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "orchard").rglob("*") if p.suffix in (".py", ".yaml")
               and "__pycache__" not in p.parts and "conf" not in p.relative_to(ROOT / "orchard").parts[:1]}
    assert sorted(listed - on_disk) == [], "listed in docs/architecture.md but not in orchard/"
    assert sorted(on_disk - listed) == [], "in orchard/ but not in docs/architecture.md's tree"


def test_no_source_file_passes_450_lines_but_forests_round_loop():
    """What docs/architecture.md says of the files' size, kept true."""
    big = {str(p.relative_to(ROOT)): n for folder in ("orchard", "workloads") for p in (ROOT / folder).rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 450}
    assert set(big) <= {"workloads/forest/train.py"}, big


def test_the_contract_lists_the_one_door_exactly():
    """docs/design/contract.md's table of ``orchard.api`` names is the door's ``DOOR`` table."""
    import re

    from orchard.api import DOOR

    page = (ROOT / "docs" / "design" / "contract.md").read_text()
    section = page.split("## The one door: `orchard.api`", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    listed = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert listed == set(DOOR), f"only in the page: {sorted(listed - set(DOOR))}; only in DOOR: {sorted(set(DOOR) - listed)}"


def test_no_tracked_file_points_at_the_teams_folder_beside_the_checkout():
    """The repository stands alone: a user's clone has no sibling folder of the team's (its
    tools, seeds, checks), so no page or source names one; say what a thing is instead (a
    prepared many-core call in docs/scaling.md once named the packing tool's path)."""
    import re
    import subprocess

    team = "shared"  # spelled apart, so this file does not name the paths it looks for
    pattern = re.compile(rf"\.\./{team}\b|\b{team}/(seeds|STYLE|checks|tools)\b")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in filter(None, files.split("\0")):
        path = ROOT / name
        if path.suffix == ".ipynb" or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # a binary file (figures, results archives)
        found += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert found == [], found
