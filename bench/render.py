"""docs/benchmarks.md from the results files, and from nothing else.

A row says "met" only when its run was a full run (not smoke), the machine was not loaded (see
bench/machine.py) and the row's own target holds; a loaded run's rows say "loaded" whatever
their figures. A bench without a results file says how to measure it.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench import BENCHES

NOTES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "notes"

TITLES = {
    "overhead": "orchard's own overhead (time to first step, metrics API)",
    "singa": "singa: layer engine vs torch autograd; architectures",
    "forest": "forest vs LightGBM, XGBoost and scikit-learn",
    "forest_paper": "forest vs peers at the paper's shape (500k pixels x 2,000 offsets)",
    "video_shift": "video: worker shifting applied vs logged only (time to a target top-1)",
    "video": "video: decode and feature stages vs plain PyAV loops",
    "flower": "flower: ring and parameter servers vs plain PyTorch DDP",
    "flower_loader": "flower: the tile loader vs torch DataLoader; CNN inference vs the blob counter",
    "flower_profile": "flower: where ring's step loop goes beside plain DDP's (CPU by process, one profiled step)",
    # the same bench run on a lent GPU machine (a copy of a clean tree: ORCHARD_BENCH_COMMIT names it)
    "flower_loader_gpu": "flower on a GPU machine: the tile loader vs torch DataLoader; CNN inference on CUDA",
    "flower_gpu": "flower on one GPU: experiment=flower_gpu's two ends vs a hand-wired run, images/s vs plain PyTorch, GPU busy",
    "flower_gpu_ps": "flower on one GPU: parameter servers vs ring at one worker",
    "flower_gpu_sweep": "flower on one GPU: a sweep whose trials share the GPU vs one trial at a time",
}


def md(text) -> str:
    """Text that cannot break a table cell or an inline code span."""
    return str(text).replace("|", "\\|").replace("`", "'").replace("\n", " ")


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def side(s: dict | None, unit: str) -> str:
    """'median unit (min-max, n=k), label' for one side of a row."""
    if s is None:
        return "-"
    if s.get("median") is None:
        return f"- ({s['label']})"
    spread = f" ({fmt(s['min'])}-{fmt(s['max'])}, n={len(s['values'])})" if len(s["values"]) > 1 else ""
    return f"{fmt(s['median'])} {unit}{spread}, {s['label']}"


def quality(q: dict | None) -> str:
    if not q:
        return "-"
    return md(", ".join(f"{k} {fmt(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v}"
                        for k, v in q.items()))


def spread_ratios(row: dict) -> tuple[float, float]:
    """orchard's worst and best ratio over the two sides' min-max spreads."""
    o, p = row["orchard"], row["peer"]
    if row["higher_is_better"]:
        return o["min"] / p["max"], o["max"] / p["min"]
    return p["min"] / o["max"], p["max"] / o["min"]


def decided(row: dict) -> str:
    """'met' or 'not met' only on >= 3 repeats whose whole min-max spread is on one side of the
    target; otherwise 'not decided' and why (one repeat decides nothing on a machine whose speed
    drifts ~1.5x through a day)."""
    n = len(row["orchard"]["values"])
    t = row["target"]
    if t.get("any_n") and n:  # a bound orchard either kept or not (its peak memory), not a timing
        return ("met" if row["target_met"] else "not met") + f" (n={n})"
    if n < 3:
        return f"not decided (n={n})"
    if "min_ratio" in t and row.get("peer") and row["peer"].get("values"):
        worst, best = spread_ratios(row)
        if worst < t["min_ratio"] <= best:
            return f"not decided (spread {fmt(worst)}x-{fmt(best)}x crosses {fmt(t['min_ratio'])}x)"
    return "met" if row["target_met"] else "not met"


def verdict(row: dict, result: dict) -> str:
    t = row.get("target")
    if row["status"] != "ok":
        if t and row.get("target_met") is not None and not result["smoke"] and not result["load"]["loaded"]:
            # a peer stopped on the bench's time limit: its bound can still be decided
            return f"{row['status']}; {t['text']}: {decided(row)}"
        return row["status"]
    if result["smoke"]:
        return "smoke size: not a result"
    if result["load"]["loaded"]:
        return "loaded"
    if not t or row.get("target_met") is None:
        return "-"
    return f"{t['text']}: {decided(row)}"


def machine_line(m: dict) -> str:
    gpu = "; ".join(f"{g['name']} (driver {g['driver']}, {g['memory']})" for g in m["gpus"]) or "no GPU"
    v = m["versions"]
    return (f"{m['cpu_model']}, {m['cores']} cores, {m['memory_gib']} GiB, {gpu}; Python {v['python']}, "
            f"torch {m['torch']} (CUDA {m['cuda'] or 'none'}), ray {v['ray']}; commit `{m['git_commit'][:10]}`"
            + (" with uncommitted changes" if m.get("git_dirty") else ""))


def load_line(result: dict) -> str:
    ld = result["load"]
    state = "**loaded**" if ld["loaded"] else "not loaded"
    return (f"load average {ld['before']['load1']:.2f} before, max {ld['during']['load1_max']:.2f} during, "
            f"{ld['after']['load1']:.2f} after; other processes used at most {ld['foreign_cores_max']:.2f} cores "
            f"(threshold {ld['threshold']:.1f}): {state}")


def bench_section(name: str, result: dict | None) -> list[str]:
    title = TITLES.get(name, name)
    if result is None:
        note = NOTES / f"{name}.json"
        kept = (f" Its last figures, from a run whose provenance cannot be traced, are kept as a note "
                f"(`docs/benchmarks/notes/{name}.json`, quoted only as a note in the workload's benchmark page)."
                if note.exists() else "")
        return [f"## {title}", "", f"Not measured from a clean tree yet (run: `python -m bench {name}`).{kept}", ""]
    lines = [f"## {title}", ""]
    if result.get("error"):
        lines += [f"The last run failed: {md(result['error'])} (run: `{result['rerun']}`).", ""]
    if result.get("partial"):  # a bench stopped part-way (bench/journal.py): the rows its runs make
        lines += [f"Stopped part-way: {md(result['partial'])}; a row without its runs says so.", ""]
    kind = "smoke run (tiny sizes, one repeat: shows the bench runs, measures nothing)" if result["smoke"] \
        else (f"{result['repeats']} repeats" if result["repeats"] != 1
              else "1 repeat (an hour-long bench: one figure per system, no spread)")
    lines += [f"`{result['rerun']}`: {kind}, {result['started_utc']}, {result['wall_s'] / 60:.1f} min"
              + (f" (full mode: {result['estimate']})" if result.get("estimate") else "") + ".",
              f"Machine: {machine_line(result['machine'])}.",
              f"Load: {load_line(result)}.", ""]
    if result["rows"]:
        lines += ["| row | orchard | peer | ratio | orchard quality | peer quality | target |",
                  "| --- | --- | --- | ---: | --- | --- | --- |"]
        for r in result["rows"]:
            q = r.get("quality") or {}
            ratio = f"{fmt(r['ratio'])}x" if r.get("ratio") is not None else "-"
            lines.append(f"| {md(r['name'])} | {md(side(r['orchard'], r['unit']))} | {md(side(r['peer'], r['unit']))} | {ratio} "
                         f"| {quality(q.get('orchard'))} | {quality(q.get('peer'))} | {md(verdict(r, result))} |")
        notes = [f"- {r['name']}: {r['note']}" for r in result["rows"] if r.get("note")]
        lines += [""] + (notes + [""] if notes else [])
    doc = (result.get("doc") or "").strip()
    if doc:
        lines += ["<details><summary>What is compared, and why it is fair (the bench's docstring)</summary>", "",
                  "```text", doc, "```", "</details>", ""]
    return lines


HEADER = """# Benchmarks

<!-- GENERATED FILE: do not edit. Written by `python -m bench --render` from docs/benchmarks/results/*.json. -->

**Generated** by `python -m bench --render` from the results files in `docs/benchmarks/results/`, which
`python -m bench` writes (one JSON per bench: the machine, versions, the exact command, the git commit,
the load before, during and after, and every repeat's figures). Nothing here is typed by hand.

How to read a row: the figures are the median over the repeats, with (min-max, n = repeats). **ratio** is
orchard's speed as a multiple of the peer's, whatever the unit: above 1.00x orchard is faster. Each side's
accuracy or output equality stands beside its time, so a faster-but-wrong row is visible. A run is
**loaded** when, before it started (the runner first waits up to 2 min for the load to settle), the
1-minute load average was above half the cores or more than half the cores were busy over 3 s, or when
processes outside the bench's own process tree used more than half the cores over any 30 s window while it
ran (the bench's own work raises the load average by itself, so the load average during a run cannot tell). A loaded run's rows never
say "met"; neither do smoke runs. A target is "met" or "not met" only over at least 3 repeats whose whole
min-max spread lies on one side of it (the worst case of the two sides' spreads for a ratio); otherwise
the row says "not decided" and why: this machine's speed drifts ~1.5x through a day. Re-measure on an idle machine: `python -m bench` (all benches) or
`python -m bench <name>`; then `python -m bench --render`, which also rewrites every figure that README and
docs/ quote from a results file (a marker pair `<!-- fig FILE "ROW" FIELD -->value<!-- /fig -->`, bench/doc_figures.py;
a test fails when a quoted figure differs from its file, or when a results file names a commit outside this
history or a tree with uncommitted changes). Records beside the benches, in docs/records/: the README's
fresh-clone install and test-suite times (`python -m bench.quickstart_record`) and each workload's default
command (`python -m bench.default_run_record forest`). Scaling beyond these machines: [scaling](scaling.md).
A scaling or video_cores bench stopped part-way (a lent machine's time limit, Ctrl-C) leaves the runs it finished in
`docs/benchmarks/results/<bench>.runs.jsonl`; `python -m bench --from-runs <that file>` writes them as its
results file, which then says "Stopped part-way" and how many runs it holds.

**Figures typed by hand** elsewhere in README and docs/ (a note taken while profiling, a setting, a
paper's figure) carry a citation in their paragraph, list item or table row (a table's caption covers
its rows), in one of four forms that `tests/test_docs.py` reads (bench/doc_citations.py):

- `(results/flower.json, commit 894215a, 2026-11-26, load 0.96)`: a measurement, with the file that
  holds it (a results file, a record or a notes page), the commit it was measured at (or, for a note
  taken by hand, `note` and the commit that recorded it), the date and the load average (`idle` or
  `unknown` where no figure was noted);
- `(paper: flower, Table 5.2)`: a figure of a seed paper, by workload (docs/papers.md names the
  document) and where in it;
- `(set: conf/workload/flower.yaml)`: not a measurement but a setting, a limit or a target, with the
  file that sets it;
- `(model: T(N) = S + W / N)`: not a measurement but a figure computed from others (a count, a
  model's output), and how.

The test fails on a figure with a unit (seconds, MB, images/s, a ratio `1.6x`, a percentage, an
accuracy, a line count) outside a marker, code and a cited block, and on a citation whose file or
commit does not exist or whose paper docs/papers.md does not name; `python -m bench.doc_citations`
lists both. A citation does not re-measure: a cited figure is as old as its date says.
"""


def render(results_dir: Path, doc: Path) -> str:
    """Write `doc` from every results file in `results_dir` (plus a line for each missing bench)."""
    results = {p.stem: json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("*.json"))}
    lines = [HEADER]
    for name in [*BENCHES, *sorted(n for n in results if n not in BENCHES)]:
        lines += bench_section(name, results.get(name))
    text = "\n".join(lines).rstrip() + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return text
