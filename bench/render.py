"""docs/benchmarks.md from the results files, and from nothing else.

A row says "met" only when its run was a full run (not smoke), the machine was not loaded (see
bench/machine.py) and the row's own target holds; a loaded run's rows say "loaded" whatever
their figures. A bench without a results file says how to measure it.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench import BENCHES

TITLES = {
    "overhead": "orchard's own overhead (time to first step, metrics API)",
    "singa": "singa: layer engine vs torch autograd; architectures",
    "forest": "forest vs LightGBM, XGBoost and scikit-learn",
    "forest_paper": "forest vs peers at the paper's shape (500k pixels x 2,000 offsets)",
    "video_shift": "video: worker shifting applied vs logged only (time to a target top-1)",
    "video": "video: decode and feature stages vs plain PyAV loops",
    "flower": "flower: ring and parameter servers vs plain PyTorch DDP",
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


def verdict(row: dict, result: dict) -> str:
    t = row.get("target")
    if row["status"] != "ok":
        if t and row.get("target_met") is not None and not result["smoke"] and not result["load"]["loaded"]:
            # a peer stopped on the bench's time limit: its bound can still be decided
            return f"{row['status']}; {t['text']}: {'met' if row['target_met'] else 'not met'}"
        return row["status"]
    if result["smoke"]:
        return "smoke size: not a result"
    if result["load"]["loaded"]:
        return "loaded"
    if not t:
        return "-"
    return f"{t['text']}: {'met' if row['target_met'] else 'not met'}"


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
        return [f"## {title}", "", f"Not measured yet (run: `python -m bench {name}`).", ""]
    lines = [f"## {title}", ""]
    if result.get("error"):
        lines += [f"The last run failed: {md(result['error'])} (run: `{result['rerun']}`).", ""]
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
say "met"; neither do smoke runs. Re-measure on an idle machine: `python -m bench` (all benches) or
`python -m bench <name>`; then `python -m bench --render`. Scaling beyond these machines: [scaling](scaling.md).
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
