"""``python -m orchard ui [<run id>] [tracking.uri=...] [port=N]``: the MLflow UI on a run store,
opened where training runs live.

It starts ``mlflow ui`` on the store, bound to 127.0.0.1 (never to every interface: the store's
runs, parameters and artifacts are the user's), waits until it answers, and prints the page to
open: the run's page when a run id is given, else the experiment of the newest run, both in
MLflow's "Model training" view (MLflow 3.17's UI opens on its GenAI view unless the URL asks:
``tracking.store.UI_TRAINING_VIEW``). A browser is opened only where one can be shown (a
desktop session), never a text browser in the terminal. Ctrl-C stops the UI and exits 0; the
default port 5000 taken by something else, the next free one is used and said.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from orchard.errors import ConfigError
from orchard.terminal.console import say

USAGE = "usage: python -m orchard ui [<run id>] [tracking.uri=sqlite:///mlflow.db] [port=5000]"
START_TIMEOUT_S = 120  # mlflow ui's first start on a busy machine (it migrates nothing: check_store did)


def ui_command(argv: list[str]) -> int:
    """Start the UI, print where to look, serve until Ctrl-C (exit 0); 2 with one line for a bad
    argument, a missing store or a UI that does not start."""
    from orchard.tracking.store import DEFAULT_URI, UI_PORT, check_store

    run_id, keys = None, {}
    for arg in argv:
        if "=" in arg:
            key, value = arg.split("=", 1)
            keys[key] = value
        elif run_id is None:
            run_id = arg
        else:
            say(USAGE, file=sys.stderr)
            return 2
    uri = keys.pop("tracking.uri", DEFAULT_URI)
    try:
        if keys.keys() - {"port"}:
            raise ConfigError(sorted(keys.keys() - {"port"})[0], "tracking.uri or port for `ui`")
        port = _port(keys.get("port"), UI_PORT)
        check_store(uri, create=False)  # the UI of a store that is not there would make an empty one
        page = _page(uri, run_id)
    except ConfigError as err:
        say(f"orchard ui: {err}", file=sys.stderr)
        return 2
    if uri.startswith(("http://", "https://")):  # a tracking server has its own UI: nothing to start
        say(f"orchard: the tracking server's UI: {page(uri.rstrip('/'))}")
        _open_browser(page(uri.rstrip("/")))
        return 0
    return _serve(uri, port, page)


def _port(given: str | None, default: int) -> int:
    """The port asked for (taken: one line), or the default, or the next free one after it."""
    if given is not None:
        if not given.isdigit() or not 0 < int(given) < 65536:
            raise ConfigError("port", f"a TCP port number (1-65535), got {given!r}")
        if not _free(int(given)):
            raise ConfigError("port", f"a free port on 127.0.0.1; {given} is taken (leave port out to take a free one)")
        return int(given)
    return next((p for p in range(default, default + 100) if _free(p)), 0) or _any_free_port()


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _page(uri: str, run_id: str | None):
    """``base -> URL`` of the page to open: the run's (a unique id prefix will do, as ``runs``
    lists them), else the newest run's experiment, else the experiment list."""
    from mlflow.tracking import MlflowClient

    from orchard.tracking.lost_runs import find_run_by_prefix
    from orchard.tracking.store import resolve_uri, UI_TRAINING_VIEW

    client = MlflowClient(resolve_uri(uri))
    if run_id is not None:
        from mlflow.exceptions import MlflowException

        try:
            run = client.get_run(run_id)
        except MlflowException:
            run = find_run_by_prefix(client, run_id, uri)
        path = f"experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    else:
        experiments = client.search_experiments()
        newest = client.search_runs([e.experiment_id for e in experiments], max_results=1,
                                    order_by=["attributes.start_time DESC"]) if experiments else []
        path = f"experiments/{newest[0].info.experiment_id}" if newest else "experiments"
    return lambda base: f"{base}/#/{path}?{UI_TRAINING_VIEW}"


def _serve(uri: str, port: int, page) -> int:
    from orchard.config import redact
    from orchard.storage.private_tmp import private_tmp
    from orchard.tracking.store import resolve_uri

    log = private_tmp() / f"mlflow-ui-{port}.log"
    server = start_server(resolve_uri(uri), port, log)
    base = f"http://127.0.0.1:{port}"
    try:
        if not answers(server, base):
            last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            say(f"orchard ui: the MLflow UI did not start on {base}: {redact.text(last)[:200]} (log: {log})",
                file=sys.stderr)
            return 2
        say(f"orchard: the MLflow UI on {redact.text(uri)} at {base} (Ctrl-C stops it; its log: {log})\n"
            f"open:      {page(base)}", flush=True)
        _open_browser(page(base))
        server.wait()
        say(f"orchard ui: the MLflow UI stopped by itself (exit {server.returncode}); its log: {log}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        say("orchard: stopping the MLflow UI", file=sys.stderr)
        return 0
    finally:
        stop_server(server)


# MLflow's server also starts its GenAI job runner (a runner and seven huey consumers, for
# scorers and prompt optimization) unless told not to: eight processes, ~19 s of CPU at the start
# on 2 cores and the first page ~6 s later, for jobs no training run submits. A user's own
# setting of the variable wins.
JOB_EXECUTION = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def start_server(uri: str, port: int, log) -> subprocess.Popen:
    """``mlflow ui`` on 127.0.0.1:``port`` over the store ``uri``, its output into ``log`` (a path,
    or None: nowhere), in its own session: the terminal's Ctrl-C reaches orchard, which stops the
    whole server (``stop_server``). Also what scripts/mlflow_ui_screenshots.py starts."""
    env = {**os.environ, JOB_EXECUTION: os.environ.get(JOB_EXECUTION, "false")}
    with open(log or os.devnull, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                                 "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def answers(server, base: str, timeout_s: float = START_TIMEOUT_S) -> bool:
    """The server at ``base`` answers its /health within ``timeout_s`` (False: it did not, or it ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def stop_server(server) -> None:
    """The server and the workers it forked (its own process group): TERM, then KILL, until the
    group is empty: a worker that outlives the leader by a moment still holds the port."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if not _group_alive(server):
            return
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(server):
            time.sleep(0.1)


def _group_alive(server) -> bool:
    server.poll()  # reaps the leader once it has ended, so its zombie does not count
    try:
        os.killpg(server.pid, 0)
        return True
    except ProcessLookupError:
        return False


def _open_browser(url: str) -> None:
    """A desktop's browser only: in a terminal over ssh, ``webbrowser`` would run lynx in it."""
    if sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        import webbrowser

        try:
            webbrowser.open(url, new=2)
        except Exception:  # noqa: BLE001 - no browser is no error: the URL is printed
            pass
