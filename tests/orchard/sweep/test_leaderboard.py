"""orchard/sweep/leaderboard.py: trials ranked by the sweep metric, a diverged one last whatever the mode."""
from __future__ import annotations

import pytest


# --------------------------------------------------------------------------- non-finite metrics
def finished_trials(values):
    """Finished Tune trials (what ``leaderboard`` reads of them) with these sweep metrics."""
    from types import SimpleNamespace

    from orchard.sweep.leaderboard import FINAL

    return [SimpleNamespace(trial_id=f"t{i}", status="TERMINATED", config={"tiny.lr": (i + 1) / 10},
                            last_result={"train/loss": v, "run_id": f"run{i}", FINAL: 1.0})
            for i, v in enumerate(values)]


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("values, mode, best", [
    ([NAN, 2.0, 1.0], "min", 1.0), ([3.0, NAN, 1.0, 2.0], "min", 1.0),
    ([NAN, 2.0, 1.0], "max", 2.0), ([3.0, NAN, 1.0, 2.0], "max", 3.0),
    ([INF, -INF, 0.5, NAN], "min", 0.5), ([INF, -INF, 0.5, NAN], "max", 0.5)])
def test_a_diverged_trial_ranks_last_whatever_the_mode(values, mode, best):
    import math

    from orchard.sweep.leaderboard import best_row, leaderboard

    rows = leaderboard(finished_trials(values), ["tiny.lr"], "train/loss", mode)
    assert best_row(rows)["metric"] == best
    finite = [r["metric"] for r in rows if math.isfinite(r["metric"])]
    assert finite == sorted(finite, reverse=(mode == "max"))
    assert all(not math.isfinite(r["metric"]) for r in rows[len(finite):])   # the rest, after every finite one
