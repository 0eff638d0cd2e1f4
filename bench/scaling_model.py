"""docs/scaling.md's model of each workload, fitted from ``python -m bench scaling`` and checked.

    python -m bench.scaling_model            # print the tables from docs/benchmarks/results/scaling*.json
    python -m bench.scaling_model --write    # and put them into docs/scaling.md, between their markers

**One node** (Amdahl's law): the work's seconds at N workers are T(N) = S + W / N, with W the part
that divides among the workers (tasks, Train workers' steps, decode actors) and S the part that
does not (the driver's phases, per-round and per-epoch fixed costs, Ray's scheduling). Fitted by
least squares in 1/N over every worker count of the results file (with only 1 and 2 workers: the
line through them, W = 2 (T(1) - T(2)), S = 2 T(2) - T(1)); a negative S (better than linear,
e.g. caches that fit once split) is kept as measured and called so.

**Nodes** with the same CPUs: T_k = T_1 + c x B_k, where B_k is what crossed between the nodes
(the loopback bytes of the k-node run beyond the one-node run's) and c the seconds each byte cost,
fitted from the two-node row. With the data spread evenly over k nodes a share (k - 1) / k of a
transfer crosses, so B_4 = 1.5 x B_2.

**Checked**: where a bigger machine's file exists (``scaling_<cores>c.json``), each of its worker
rows beside what the model fitted here predicts for it; a miss of more than 25% is marked.

**forest at the seed's scale**: the seed trains 300,000 images x 2,000 examples, 2,000 offsets x
50 thresholds, depth 20, and reports an effective parallelism of 140 on 235 machines. Scaled
from the bench's forest shape, W grows with examples x offsets x depth (phase 2: every example
through every offset, every round), and S is given two readings, because two points cannot say
what it is made of: per round (a fixed cost per round: scheduling, barriers; grows with depth)
or per histogram cell (the driver's split search and frontier, phases 3-4 as orchard runs them
today; grows with nodes x offsets x thresholds x classes). Effective parallelism is then
W / (S + W / N): the driver's time is not task time.
"""
from __future__ import annotations

import argparse
import glob
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "results"
DOC = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- scaling model: python -m bench.scaling_model --write -->", "<!-- /scaling model -->"
WORKERS = re.compile(r"^(?P<workload>.+): (?P<n>\d+) workers vs 1 worker$")
NODES = re.compile(r"^(?P<workload>.+): (?P<k>\d+) nodes vs one node \(same (?P<cpus>\d+) CPUs\)$")
# the seed's problem (000, section 2.3): one tree
SEED = {"examples": 300_000 * 2_000, "offsets": 2_000, "thresholds": 50, "depth": 20, "classes": 31}
MISS = 0.25


def fit_amdahl(points: dict[int, float]) -> tuple[float, float]:
    """(S, W) of T(N) = S + W / N by least squares over ``{N: seconds}`` (two or more counts)."""
    xs, ys = [1.0 / n for n in points], list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        raise ValueError("one worker count: nothing to fit")
    w = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
    return my - w * mx, w


def worker_points(rows: list[dict]) -> dict[str, dict[int, float]]:
    """``{workload: {workers: median seconds}}`` from a results file's worker rows."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        m = WORKERS.match(r["name"])
        if m and r.get("status") == "ok":
            points = out.setdefault(m["workload"], {})
            points[1] = r["peer"]["median"]
            points[int(m["n"])] = r["orchard"]["median"]
    return out


def node_costs(rows: list[dict]) -> dict[str, dict]:
    """``{workload: {k, one_s, more_s, extra_mb, s_per_mb}}`` from the first more-nodes row of each."""
    out = {}
    for r in rows:
        m = NODES.match(r["name"])
        if m and r.get("status") == "ok" and m["workload"] not in out:
            q = r.get("quality") or {}
            extra_mb = (q.get("orchard", {}).get("loopback MB", 0.0) - q.get("peer", {}).get("loopback MB", 0.0))
            extra_s = r["orchard"]["median"] - r["peer"]["median"]
            out[m["workload"]] = {"k": int(m["k"]), "one_s": r["peer"]["median"], "more_s": r["orchard"]["median"],
                                  "extra_mb": extra_mb, "s_per_mb": extra_s / extra_mb if extra_mb > 0 else None}
    return out


def four_nodes(cost: dict) -> float:
    """T_4 from the two-node row: the crossing share (k-1)/k, 3/4 against 1/2."""
    share = lambda k: (k - 1) / k  # noqa: E731
    return cost["one_s"] + (cost["more_s"] - cost["one_s"]) * share(4) / share(cost["k"])


def forest_shape(f: dict) -> dict:
    """The problem size of a composed ``forest`` config section."""
    return {"examples": f["train_images"] * f["examples_per_image"], "offsets": f["n_offsets"],
            "thresholds": f["n_thresholds"], "depth": f["max_depth"], "classes": SEED["classes"]}


def bench_forest_shape() -> dict:
    """The shape ``python -m bench scaling`` trains: its overrides over debug=smoke, composed."""
    from bench.scaling import run_overrides
    from orchard.config import compose

    return forest_shape(compose(run_overrides("forest"))["forest"])


def cells(shape: dict) -> float:
    """Histogram cells over a tree's rounds: frontier nodes (at most the examples) x offsets x thresholds x classes x 2."""
    nodes = sum(min(2 ** d, shape["examples"]) for d in range(int(shape["depth"])))
    return nodes * shape["offsets"] * shape["thresholds"] * shape["classes"] * 2


def seed_projection(s: float, w: float, shape: dict, workers=(64, 128, 256)) -> list[dict]:
    """Effective parallelism W' / (S' + W' / N) at the seed's scale under both readings of S."""
    grow_w = (SEED["examples"] * SEED["offsets"] * SEED["depth"]) / (shape["examples"] * shape["offsets"] * shape["depth"])
    readings = {"S per round": SEED["depth"] / shape["depth"], "S per histogram cell": cells(SEED) / cells(shape)}
    rows = []
    for n in workers:
        row = {"workers": n}
        for name, grow_s in readings.items():
            ws, ss = w * grow_w, max(s, 0.0) * grow_s
            row[name] = ws / (ss + ws / n)
        rows.append(row)
    return rows


def tables(results: Path = RESULTS) -> str:
    """The Markdown of docs/scaling.md's model section, from the results files."""
    main = json.loads((results / "scaling.json").read_text())
    cores = main["machine"]["cores"]
    points, costs = worker_points(main["rows"]), node_costs(main["rows"])
    bigger = {}
    for path in sorted(glob.glob(str(results / "scaling_*c.json"))):
        for workload, pts in worker_points(json.loads(Path(path).read_text())["rows"]).items():
            bigger.setdefault(workload, {}).update({n: (t, Path(path).name) for n, t in pts.items()})
    lines = [f"Fitted from results/scaling.json ({cores} cores, {main['started_utc'][:10]}, "
             f"{'LOADED' if main['load']['loaded'] else 'not loaded'}); the work's seconds, medians.", "",
             "| workload | T(1) | S (does not divide) | W (divides) | predicted T(16) / speed-up | "
             "2 nodes: extra s per MB crossed | predicted 4 nodes | checked on a bigger machine |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    fits = {}
    for workload, pts in points.items():
        s, w = fit_amdahl(pts)
        fits[workload] = (s, w)
        t16 = s + w / 16
        cost = costs.get(workload)
        node = "no row" if not cost else (f"{cost['s_per_mb'] * 1e3:.2f} ms/MB ({cost['extra_mb']:.0f} MB)"
                                           if cost["s_per_mb"] is not None else "no bytes crossed")
        checks = []
        for n, (measured, name) in sorted(bigger.get(workload, {}).items()):
            if n > 1:
                predicted = s + w / n
                miss = abs(predicted - measured) / measured
                checks.append(f"{n} workers: {predicted:.2f} s predicted, {measured:.2f} s measured"
                              + (" (**miss**)" if miss > MISS else "") + f" ({name})")
        predicted = (f"{t16:.2f} s / {pts[1] / t16:.2f}x" if w > 0
                     else "none: more workers were slower here (no part divides)")
        lines.append(f"| {workload} | {pts[1]:.2f} s | {s:.2f} s{' (better than linear)' if s < 0 else ''} | "
                     f"{w:.2f} s | {predicted} | {node} | "
                     f"{f'{four_nodes(cost):.2f} s' if cost else '-'} | {'; '.join(checks) or 'not measured'} |")
    if "forest" in fits:
        shape = bench_forest_shape()
        s, w = fits["forest"]
        lines += ["", f"forest at the seed's scale (from S = {s:.2f} s, W = {w:.2f} s at {shape['examples']:,.0f} "
                      f"examples, {shape['offsets']:.0f} offsets x {shape['thresholds']:.0f} thresholds, depth "
                      f"{shape['depth']:.0f}; the seed: 140 on 235 machines):", "",
                  "| workers | effective parallelism, S per round | S per histogram cell |", "| --- | --- | --- |"]
        for r in seed_projection(s, w, shape):
            lines.append(f"| {r['workers']} | {r['S per round']:.0f} | {r['S per histogram cell']:.1f} |")
    return "\n".join(lines)


def write(doc: Path = DOC, results: Path = RESULTS) -> None:
    text = doc.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:start] + "\n" + tables(results) + "\n" + text[end:])


def block(doc: Path = DOC) -> str:
    """What docs/scaling.md holds between the markers now."""
    text = doc.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.scaling_model")
    ap.add_argument("--write", action="store_true", help="rewrite the tables in docs/scaling.md")
    args = ap.parse_args()
    if args.write:
        write()
        print(f"wrote {DOC}")
    else:
        print(tables())
