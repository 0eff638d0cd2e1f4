"""Screenshots of orchard's runs in the MLflow UI, taken by a real headless Chromium.

Starts ``mlflow ui`` on 127.0.0.1 on a free port against a tracking store, opens pages in
headless Chromium (Debian's ``chromium``: ``apt-get install chromium``) and saves PNGs:

  run_charts.png      the charts (model metrics) tab of one run, searched for ``--run-chart-filter``
  run_artifacts.png   the same run's artifacts tab, showing one of its figures
  compare_flower.png  MLflow's "Compare runs" page for the newest finished flower runs with
                      strategy=ring and strategy=ps (run details, parameters, metrics side by side)
  compare_flower_charts.png  the flower experiment's chart view filtered to those two runs, its
                      charts searched for ``--chart-filter`` (throughput): one line per run
                      (what README shows)

Usage (3.5 min measured on a busy 2-core machine: the UI's start, then ~25 s per page):
  python -m orchard workload=flower strategy=ring debug=smoke
  python -m orchard workload=flower strategy=ps debug=smoke
  python scripts/mlflow_ui_screenshots.py [--store sqlite:///mlflow.db] [--out docs/images] \\
      [--run RUN_ID] [--figure figures/density_maps.png] [--compare RUN_A RUN_B]

Without ``--run`` the newest finished flower ring run is shown; without ``--compare``, the newest
finished ring and ps flower runs. Look at the pictures: spinners or a grey skeleton mean the page
had not drawn within ``--wait-s`` seconds (a busy machine needs more).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(store: str, port: int) -> subprocess.Popen:
    """``mlflow ui`` on 127.0.0.1:port; returns once /health answers (or raises)."""
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow ui exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise RuntimeError("mlflow ui did not answer /health within 120 s")


# Run in the page once it has drawn: close the assistant side panel (room for the charts) and,
# where there is one, type CHART_FILTER into the chart search box (a React input: set the value
# through the native setter, then announce it).
TIDY_JS = """(() => {
  for (const b of document.querySelectorAll('button[aria-label="Close"]')) {
    if (b.closest('div') && /Assistant/.test(b.closest('div').parentElement.innerText || '')) { b.click(); break; }
  }
  const box = [...document.querySelectorAll('input')].find(i => /Search metric charts/i.test(i.placeholder || ''));
  if (box && FILTER) {
    Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(box, FILTER);
    box.dispatchEvent(new Event('input', {bubbles: true}));
  }
})()"""


def screenshot(chromium: str, url: str, out: Path, size: tuple[int, int], wait_s: float,
               chart_filter: str = "") -> None:
    """One page as a PNG, through the DevTools protocol: load it, wait ``wait_s`` seconds of real
    time (the UI fetches metric histories and draws its charts after the page has loaded; a
    one-shot ``--screenshot`` takes them as spinners), then capture."""
    js = TIDY_JS.replace("FILTER", json.dumps(chart_filter), 2)
    asyncio.run(_capture(chromium, url, out, size, wait_s, js))
    print(f"saved {out}  ({url})")


async def _capture(chromium: str, url: str, out: Path, size: tuple[int, int], wait_s: float, js: str) -> None:
    import aiohttp  # an MLflow dependency

    port = free_port()
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                    "--disable-background-networking", "--disable-component-update",
                                    "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                                    "--remote-debugging-address=127.0.0.1", f"--remote-debugging-port={port}",
                                    f"--window-size={size[0]},{size[1]}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            async with aiohttp.ClientSession() as http:
                pages = []
                for _ in range(120):  # the DevTools endpoint answers a second or two after start
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                            pages = [t for t in await r.json() if t.get("type") == "page"]
                        if pages:
                            break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.5)
                if not pages:
                    raise RuntimeError("chromium's DevTools endpoint did not answer")
                async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    ids = iter(range(1, 1 << 30))

                    async def call(method: str, **params):
                        i = next(ids)
                        await ws.send_json({"id": i, "method": method, "params": params})
                        async for msg in ws:
                            reply = json.loads(msg.data)
                            if reply.get("id") == i:
                                if "error" in reply:
                                    raise RuntimeError(f"{method}: {reply['error']}")
                                return reply.get("result", {})
                        raise RuntimeError("chromium closed the DevTools connection")

                    await call("Page.enable")
                    await call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1],
                               deviceScaleFactor=1, mobile=False)
                    await call("Page.navigate", url=url)
                    await asyncio.sleep(wait_s)
                    await call("Runtime.evaluate", expression=js)
                    await asyncio.sleep(min(10.0, wait_s / 2))  # the filtered charts redraw
                    shot = await call("Page.captureScreenshot", format="png")
                    out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            os.killpg(browser.pid, 15)
            browser.wait(timeout=30)


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    ap.add_argument("--out", default="docs/images")
    ap.add_argument("--run", help="run id for the charts and artifacts shots (default: newest flower ring run)")
    ap.add_argument("--figure", default="figures/density_maps.png", help="artifact opened in the artifacts shot")
    ap.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="default: newest flower ring and ps runs")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    ap.add_argument("--run-chart-filter", default="train/", help="chart search in the run's charts shot")
    ap.add_argument("--chart-filter", default="throughput/",
                    help="chart search in the comparison's chart view (default: the throughput charts)")
    ap.add_argument("--wait-s", type=float, default=20.0, help="seconds each page gets to draw before the shot")
    args = ap.parse_args(argv)
    if not args.chromium:
        print("no chromium on PATH: apt-get install chromium (or pass --chromium PATH)", file=sys.stderr)
        return 2
    from mlflow.tracking import MlflowClient

    client = MlflowClient(args.store)
    flower = newest_flower_runs(client)
    run_id = args.run or (flower["ring"].info.run_id if "ring" in flower else None)
    pair = args.compare or ([flower["ring"].info.run_id, flower["ps"].info.run_id]
                            if {"ring", "ps"} <= set(flower) else None)
    if run_id is None and pair is None:
        print(f"no finished flower runs in {args.store}: run the two commands in this script's docstring",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    ui = start_ui(args.store, port)
    base = f"http://127.0.0.1:{port}/#"
    try:
        if run_id:
            exp = client.get_run(run_id).info.experiment_id
            screenshot(args.chromium, f"{base}/experiments/{exp}/runs/{run_id}/model-metrics",
                       out / "run_charts.png", (1400, 1000), args.wait_s, args.run_chart_filter)
            screenshot(args.chromium, f"{base}/experiments/{exp}/runs/{run_id}/artifacts/{args.figure}",
                       out / "run_artifacts.png", (1400, 1000), args.wait_s)
        if pair:
            exps = sorted({client.get_run(r).info.experiment_id for r in pair})
            screenshot(args.chromium, f"{base}/compare-runs?runs={json.dumps(pair)}&experiments={json.dumps(exps)}",
                       out / "compare_flower.png", (1400, 1400), args.wait_s)
            both = urllib.parse.quote("attributes.run_id IN (" + ", ".join(f"'{r}'" for r in pair) + ")")
            screenshot(args.chromium, f"{base}/experiments/{exps[0]}/runs?compareRunsMode=CHART&searchFilter={both}",
                       out / "compare_flower_charts.png", (1600, 1100), args.wait_s, args.chart_filter)
    finally:
        os.killpg(ui.pid, 15)  # the UI and the gunicorn/uvicorn workers it started
        ui.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
