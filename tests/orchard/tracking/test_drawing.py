"""orchard/tracking/drawing.py: a figure function in a Ray task with the run's context, waited for
where the driver needs it; its own error, raised where it is waited for; none lost at the end.

On the test session's Ray with a real ``MetricsSink`` that writes to no store (a run with
``tracking=none`` has one too): what a drawing logged is in the sink once ``result()`` returns.
The runs that draw this way end to end: tests/orchard/tracking/test_tracking.py (``tiny.draw``)."""
from __future__ import annotations

import pytest

from orchard.tracking import drawing
from orchard.tracking.context import RunContext

pytestmark = pytest.mark.slow  # a sink actor and Ray tasks: a few seconds on 2 cores


def _figure(ctx, value: float):
    ctx.log_metrics({"figure/value": value})
    return value * 2


def _failing(ctx, message: str):
    raise ValueError(message)


@pytest.fixture
def ctx(ray_session, tmp_path):
    from orchard.tracking.sink import MetricsSink

    return RunContext(MetricsSink.remote(None, None), None, str(tmp_path), "tiny", "tasks")


def test_a_drawing_returns_what_its_function_returned_and_what_it_logged_is_in_the_sink(ctx):
    started = drawing.start(_figure, ctx, {"value": 1.5})
    assert started.result() == 3.0 and started.result() == 3.0  # waited for once, kept
    assert ctx.last_values()["figure/value"] == 1.5  # flushed by the task before it returned


def test_every_drawing_is_waited_for_and_the_first_error_is_raised_after_the_others_ended(ctx):
    failed = drawing.start(_failing, ctx, {"message": "no such column"})
    drawings = [failed, drawing.start(_figure, ctx, {"value": 2.0})]
    with pytest.raises(ValueError, match="no such column"):
        drawing.wait_all(drawings)
    assert drawings == []  # none left to wait for at the run's end
    assert ctx.last_values()["figure/value"] == 2.0  # the one after the failure still drew
    with pytest.raises(ValueError, match="no such column"):
        failed.result()  # its own error again, wherever it is waited for next
