"""What every workload's ``figures.py`` shares: a headless pyplot, a figure as PNG bytes and the
series a run logged.

Figures are PNG artifacts under ``figures/`` (``ctx.log_figure``); a workload draws them at the
end of its run, from arrays it still holds or from the metrics it logged, on the driver or beside
it (``ctx.draw``'s Ray task, the workload's side process ``ctx.side``).
"""
from __future__ import annotations

import io
from typing import Callable


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on a Ray node or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(figure, dpi: int = 100) -> bytes:
    """A matplotlib figure as the PNG that ``RunContext.log_figure`` logs."""
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def drawn_png(draw: Callable, *args) -> bytes:
    """``draw(*args)`` (a function that returns a matplotlib figure) as PNG bytes, the figure
    closed: a figure drawn where no run context is (the side process, ``ctx.side``), for the driver
    to log with ``ctx.log_bytes``."""
    plt = pyplot()
    figure = draw(*args)
    try:
        return png_bytes(figure)
    finally:
        plt.close(figure)


def logged_series(ctx, keep: Callable[[str], bool]) -> dict[str, tuple[list[int], list[float]]]:
    """``{key: (steps, values)}`` of every metric of the run whose key ``keep(key)`` accepts, as
    the tracking store has them (after a flush); ``{}`` when the run is not tracked."""
    if not ctx.run_id or not ctx.tracking_uri:
        return {}
    from mlflow.tracking import MlflowClient

    ctx.flush()
    client = MlflowClient(ctx.tracking_uri)
    out = {}
    for key in sorted(k for k in client.get_run(ctx.run_id).data.metrics if keep(k)):
        points = sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(ctx.run_id, key))
        out[key] = ([p[0] for p in points], [p[2] for p in points])
    return out
