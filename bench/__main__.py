"""python -m bench [names...] [--repeats N] [--smoke] [--out DIR] [--render] [--doc PATH]"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench import BENCHES, EXTRA_BENCHES, NEEDS_CUDA, ONE_REPEAT_BENCHES


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description="orchard vs its peers, side by side.")
    ap.add_argument("names", nargs="*", help=f"benches to run: {', '.join([*BENCHES, *EXTRA_BENCHES])} "
                                             "(default: all but the extra ones; none with only --render)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per bench (full: 3, at least 3, or 1 for forest_paper alone; smoke: 1)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: checks the benches run, measures nothing")
    ap.add_argument("--out", default=None, help="results folder (full: docs/benchmarks/results; smoke: a temp folder)")
    ap.add_argument("--render", action="store_true", help="write the Markdown tables from the results folder")
    ap.add_argument("--from-runs", metavar="JOURNAL", default=None,
                    help="write the results file of a bench stopped part-way from the runs its journal kept "
                         "(<results>/<bench>.runs.jsonl) into --out (default: docs/benchmarks/results)")
    ap.add_argument("--doc", default=None, help="Markdown to write (full: docs/benchmarks.md; smoke: <out>/benchmarks.md)")
    ap.add_argument("--settle", type=float, default=None,
                    help="seconds to wait at most for the load to drop before each bench (full: 120, smoke: 0)")
    return ap.parse_args(argv)


def fail(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr)
    raise SystemExit(2)


def cuda_missing() -> str | None:
    """Why a bench of NEEDS_CUDA cannot run here (bench/flower_gpu.py: unmet), or None."""
    from bench.flower_gpu import unmet

    return unmet()


def min_repeats(names: list[str]) -> int:
    """Repeats a full-mode result needs: 3, or 1 when only hour-long benches are named."""
    return 1 if names and all(n in ONE_REPEAT_BENCHES for n in names) else 3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    from bench.runner import RESULTS, rebuild, run_bench

    if args.from_runs:
        if args.names or args.smoke:
            fail("--from-runs: names no bench and takes no --smoke (the journal says which bench it was)")
        kept = Path(args.from_runs)
        if not kept.is_file():
            fail(f"--from-runs: no such file: {kept}; allowed: a bench's journal, <results>/<bench>.runs.jsonl")
        try:
            result = rebuild(kept, Path(args.out) if args.out else RESULTS)
        except ValueError as exc:
            fail(f"--from-runs: {exc}")
        print(f"bench: {result['bench']}: {len(result['rows'])} rows {result['partial']}; "
              f"{'LOADED' if result['load']['loaded'] else 'not loaded'}", flush=True)
        return 0
    known = {**BENCHES, **EXTRA_BENCHES}
    for name in args.names:
        if name not in known:
            fail(f"names: unknown bench '{name}'; allowed: {', '.join(known)}")
    for name in args.names:
        if name in NEEDS_CUDA and (why := cuda_missing()):
            fail(f"{name}: {why}")
    repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 3)
    if not args.smoke and repeats < min_repeats(args.names):
        fail(f"--repeats: {repeats} is too few for a result; allowed: 3 or more (or --smoke; "
             f"1 or more when every bench named is one of {', '.join(sorted(ONE_REPEAT_BENCHES))})")
    if repeats < 1:
        fail("--repeats: allowed: 1 or more")
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "orchard-bench-smoke" if args.smoke else RESULTS)
    if args.smoke and out.resolve() == RESULTS.resolve():
        fail(f"--out: smoke results never go to {RESULTS}; allowed: any other folder")
    names = args.names or ([] if args.render and not args.smoke else list(BENCHES))
    command = " ".join(["python -m bench", *argv])
    settle_s = args.settle if args.settle is not None else (0.0 if args.smoke else 120.0)
    failed = []
    for name in names:
        print(f"bench: {name} ({'smoke' if args.smoke else f'{repeats} repeats'}), load {os.getloadavg()[0]:.2f}",
              flush=True)
        result = run_bench(name, args.smoke, repeats, out, command, settle_s)
        state = f"failed: {result['error']}" if result["error"] else f"{len(result['rows'])} rows"
        print(f"bench: {name} done in {result['wall_s']:.0f} s, {state}; "
              f"{'LOADED' if result['load']['loaded'] else 'not loaded'} -> {out / (name + '.json')}", flush=True)
        if result["error"]:
            failed.append(name)
    if args.render:
        from bench.render import render

        doc = Path(args.doc) if args.doc else (out / "benchmarks.md" if args.smoke else Path(__file__).parents[1] / "docs" / "benchmarks.md")
        render(out, doc)
        print(f"bench: wrote {doc}")
        if not args.smoke:  # the figures quoted in README and docs/ follow the results files
            from bench.doc_figures import render_all

            for path in render_all():
                print(f"bench: updated the figures in {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
