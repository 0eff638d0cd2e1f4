"""orchard's runs in the MLflow UI, opened by a real headless Chromium: checked, and photographed.

Starts ``mlflow ui`` on 127.0.0.1 on a free port against a tracking store and opens its pages
with Chromium's own ``--dump-dom`` and ``--screenshot`` (Debian's ``chromium``:
``apt-get install chromium``; no driver library, no DevTools client). It checks, in the page
as the browser drew it, that

  * the experiment, opened as orchard's summary links it, shows its runs table (MLflow's "Model
    training" view), not the GenAI overview of traces, and its Dataset column names the run's data;
  * the run's page lists its logged model and its dataset, no bookkeeping counter among its
    metrics, and its tags lead with what the run is (orchard.workload before orchard.host);
  * the model's page shows its headline metric, measured on the run's dataset, and no bookkeeping
    series (``system/``, ``cache/``);
  * the run's "Model metrics" tab opens on its ``headline`` section, and no bookkeeping section
    (``cache``, ``cluster``, ``data``) is among its charts;

(MLflow 3.17's UI picks GenAI or Model training per browser, GenAI unless switched, or from the
``workflowType`` URL parameter that orchard's links carry: orchard/tracking/store.py, ``run_url``)

and saves the pictures docs/ shows:

  mlflow_experiment.png      the experiment as the UI opens it: runs, their Dataset column
  mlflow_run.png             one run's page: description, Logged models, Datasets, parameters, metrics
  mlflow_model.png           the run's logged model: its quality metrics, linked to the run's dataset
  mlflow_run_charts.png      the run's "Model metrics" tab: its chart sections, the headline first
  mlflow_compare_flower.png  "Compare runs" for the newest flower strategy=ring and strategy=ps runs

Usage (about 2 min on a busy 2-core machine: the UI's start, then ~15 s per page):
  python -m orchard workload=flower strategy=ring debug=smoke
  python -m orchard workload=flower strategy=ps debug=smoke
  python scripts/mlflow_ui_screenshots.py [--store sqlite:///mlflow.db] [--out docs/images] [--run RUN_ID]

Exit 0 when the pages show what they should, 1 (with what is missing) when not, 2 when there is
no browser or no run. Look at the pictures: a grey skeleton means the page had not drawn within
``--budget-ms`` of the browser's virtual time (a busy machine needs more).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# Flags measured to render the MLflow UI headless here (measured on the project's machines); the virtual time
# budget lets the single-page app fetch and draw before the dump or the shot.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")
# What only the GenAI overview shows (an experiment without the model-training kind opens there).
GENAI_MARKS = ("Detect Issues in Your Traces", "Judges", "Agent versions")
# The MLflow Assistant's side panel (px at the right of every page): cropped off the pictures.
ASSISTANT_PANEL_PX = 560


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(store: str, port: int) -> subprocess.Popen:
    """``mlflow ui`` on 127.0.0.1:port, as ``python -m orchard ui`` starts it; returns once /health
    answers (or raises)."""
    from orchard.cli.ui import answers, start_server

    proc = start_server(store, port, None)
    if not answers(proc, f"http://127.0.0.1:{port}", timeout_s=300):   # ~15 s on an idle box; minutes on a loaded one
        stop_ui(proc)
        raise RuntimeError(f"mlflow ui did not answer /health within 300 s (exit {proc.poll()})")
    return proc


def stop_ui(proc: subprocess.Popen) -> None:
    """The UI and the server workers it started (its process group): asked, then made, to stop."""
    from orchard.cli.ui import stop_server

    stop_server(proc)


def open_page(chromium: str, url: str, png: Path | None = None, size: tuple[int, int] = (1400, 1000),
              budget_ms: int = 20000, assistant: bool = True) -> str:
    """The page as Chromium drew it: its DOM as text, and a screenshot into ``png`` if given
    (without the assistant's side panel, on the pages that have one)."""
    def run(*action: str) -> str:
        with tempfile.TemporaryDirectory() as profile:
            out = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                  f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={budget_ms}",
                                  *action, url], capture_output=True, text=True, timeout=900)  # a loaded box: minutes
        return out.stdout

    if png is not None:
        png.parent.mkdir(parents=True, exist_ok=True)
        run(f"--screenshot={png.resolve()}")
        if assistant:
            _crop_right(png, ASSISTANT_PANEL_PX)
        print(f"saved {png}  ({url})")
    return run("--dump-dom")


def _crop_right(png: Path, px: int) -> None:
    from PIL import Image

    with Image.open(png) as image:
        kept = image.crop((0, 0, image.width - px, image.height))
    kept.save(png)


def check_experiment_page(dom: str, dataset: str) -> list[str]:
    """What is wrong with the experiment's landing page (empty: nothing)."""
    bad = [f"the experiment opened on the GenAI overview ({mark!r})" for mark in GENAI_MARKS if mark in dom]
    if dataset not in dom:
        bad.append(f"the runs table does not name the dataset {dataset!r}")
    return bad


def check_run_page(dom: str, model: str, dataset: str) -> list[str]:
    """What is wrong with a run's page: it must list its logged model and its dataset, no
    bookkeeping counter among its metrics (``cache/``, ``cluster/``: tables/bookkeeping.json), and
    lead its tags with what the run is, the driver's (``orchard.host``, ...) after them."""
    bad = []
    if "Logged models" not in dom or f">{model}<" not in dom:
        bad.append(f"the run page does not list its logged model {model!r}")
    if dataset not in dom:
        bad.append(f"the run page does not list its dataset {dataset!r}")
    bad += [f"the run page lists the bookkeeping metric prefix {p!r}" for p in (">cache/", ">cluster/") if p in dom]
    if "orchard.host" in dom and dom.find("orchard.workload") > dom.find("orchard.host"):
        bad.append("the run page's tags lead with the driver's (orchard.host before orchard.workload)")
    return bad


def check_model_page(dom: str, dataset: str, metric: str) -> list[str]:
    """What is wrong with the logged model's page: it must say what it is (its description), show
    its quality metric linked to the run's dataset, and none of the run's bookkeeping series
    (system samples, cache counters)."""
    bad = ["the model page has no description"] if "No description" in dom else []
    if metric not in dom:
        bad.append(f"the model page does not show its metric {metric!r}")
    if dataset not in dom:
        bad.append(f"the model page does not name the dataset {dataset!r} its metrics were measured on")
    bad += [f"the model page lists the bookkeeping metric prefix {p!r}" for p in ("system/", "cache/") if p in dom]
    return bad


# The section headers of a run's chart tab, in the order the UI draws them (MLflow 3.17's DOM).
SECTION_HEADER = re.compile(r'data-testid="experiment-view-compare-runs-section-header".*?white-space: pre;">([^<]*)</div>', re.S)


def check_charts_page(dom: str, skipped: bool = False) -> list[str]:
    """What is wrong with a run's "Model metrics" tab: it must open on the headline section and
    chart no bookkeeping (orchard/tracking/bookkeeping.py ``chart_sections`` says the same from the
    names). A run that skipped input files opens on their counts (``data/skipped_*``), then the headline."""
    from orchard.tracking.bookkeeping import opening_section

    sections = SECTION_HEADER.findall(dom)
    if not sections:
        return ["the run's Model metrics tab drew no chart section (a grey page: give it more --budget-ms)"]
    first = opening_section(sections) if skipped else sections[0]
    bad = [] if first == "headline" else [f"the run's charts open on {first!r}, not 'headline' ({sections[:4]})"]
    return bad + [f"the run's charts have a bookkeeping section {s!r}" for s in sections
                  if s.split("/")[0] in ("cache", "cluster") or (s.startswith("data") and not skipped)]


def newest_flower_runs(client) -> dict[str, object]:
    """The newest finished train run of each flower strategy: {"ring": Run, "ps": Run}."""
    exp = client.get_experiment_by_name("flower")
    if exp is None:
        return {}
    found = {}
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED' and params.mode = 'train'",
                                  order_by=["attributes.start_time DESC"]):
        found.setdefault(run.data.params.get("strategy.name"), run)
    return found


def visit(store: str, run_id: str, chromium: str, out: Path | None = None, compare: list[str] | None = None,
          budget_ms: int = 20000) -> list[str]:
    """Open the UI on ``store`` and check the run's experiment and page (screenshots into ``out``
    when given); returns what is wrong."""
    from mlflow.tracking import MlflowClient

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from orchard.tracking.store import UI_TRAINING_VIEW

    client = MlflowClient(store)
    run = client.get_run(run_id)
    exp = run.info.experiment_id
    dataset = run.inputs.dataset_inputs[0].dataset.name if run.inputs and run.inputs.dataset_inputs else "(no dataset)"
    model_ids = [m.model_id for m in (run.outputs.model_outputs if run.outputs else [])]
    logged = client.get_logged_model(model_ids[-1]) if model_ids else None
    model = logged.name if logged else "(no model)"
    headline = next((k for k in sorted(run.data.metrics) if k.startswith("headline/")), "headline/")
    port = free_port()
    ui = start_ui(store, port)
    base = f"http://127.0.0.1:{port}/#"
    shot = (lambda name: out / name) if out else (lambda name: None)
    try:
        bad = check_experiment_page(open_page(chromium, f"{base}/experiments/{exp}?{UI_TRAINING_VIEW}",
                                              shot("mlflow_experiment.png"), (2160, 520), budget_ms), dataset)
        bad += check_run_page(open_page(chromium, f"{base}/experiments/{exp}/runs/{run_id}?{UI_TRAINING_VIEW}",
                                        shot("mlflow_run.png"), (2200, 1850), budget_ms), model, dataset)
        bad += check_charts_page(open_page(chromium, f"{base}/experiments/{exp}/runs/{run_id}/model-metrics?{UI_TRAINING_VIEW}",
                                           shot("mlflow_run_charts.png"), (1600, 1200), budget_ms),
                                 skipped=run.data.metrics.get("data/skipped_files", 0) > 0)
        if logged is not None:
            bad += check_model_page(open_page(chromium, f"{base}/experiments/{exp}/models/{logged.model_id}?{UI_TRAINING_VIEW}",
                                              shot("mlflow_model.png"), (2000, 1400), budget_ms), dataset, headline)
        if compare and out:
            exps = sorted({client.get_run(r).info.experiment_id for r in compare})
            open_page(chromium, f"{base}/compare-runs?runs={json.dumps(compare)}&experiments={json.dumps(exps)}"
                      f"&{UI_TRAINING_VIEW}", out / "mlflow_compare_flower.png", (1400, 1400), budget_ms, assistant=False)
    finally:
        stop_ui(ui)
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    ap.add_argument("--out", default="docs/images")
    ap.add_argument("--run", help="the run to open (default: the newest finished flower ring run)")
    ap.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="default: newest flower ring and ps runs")
    ap.add_argument("--chromium", default=find_chromium())
    ap.add_argument("--budget-ms", type=int, default=20000, help="browser virtual time each page gets to draw")
    args = ap.parse_args(argv)
    if not args.chromium:
        print("no chromium on PATH: apt-get install chromium (or pass --chromium PATH)", file=sys.stderr)
        return 2
    from mlflow.tracking import MlflowClient

    flower = newest_flower_runs(MlflowClient(args.store))
    run_id = args.run or (flower["ring"].info.run_id if "ring" in flower else None)
    pair = args.compare or ([flower["ring"].info.run_id, flower["ps"].info.run_id] if {"ring", "ps"} <= set(flower) else None)
    if run_id is None:
        print(f"no finished flower ring run in {args.store}: run the commands in this script's docstring", file=sys.stderr)
        return 2
    bad = visit(args.store, run_id, args.chromium, Path(args.out), pair, args.budget_ms)
    for line in bad:
        print(f"mlflow ui: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
