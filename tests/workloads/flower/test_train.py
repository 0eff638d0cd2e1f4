"""workloads/flower/train.py: the Train workers' loop: a profiled step's trace."""
from __future__ import annotations

from pathlib import Path

import torch


def test_a_profiled_steps_trace_is_logged_from_the_users_own_folder_and_not_kept(monkeypatch):
    """The profiled step's Chrome trace goes to the run (``traces/``) from this user's 0700
    folder, never a guessable /tmp path, and no copy stays on the node.  (The torch profiler
    itself, ~10 s to start here, writes real traces in the smoke runs: test_run.py.)"""
    import json
    import os
    import stat

    from orchard.storage.private_tmp import private_tmp
    from workloads.flower import train
    from workloads.flower.train import profiled_step

    def trace_of(run_step, path):
        run_step()
        path.write_text(json.dumps({"traceEvents": [{"name": "step"}]}))

    monkeypatch.setattr(train, "trace_step", trace_of)

    class Ctx:
        logged = []

        def log_artifact(self, path, folder):
            path = Path(path)
            mode = stat.S_IMODE(path.parent.parent.stat().st_mode)
            self.logged.append((path, folder, path.parent.parent, mode, json.loads(path.read_text())))

    steps = []
    profiled_step(lambda: steps.append(torch.ones(4).sum()), Ctx(), rank=1, step=20)
    (path, folder, parent, mode, trace), = Ctx.logged
    assert steps and folder == "traces" and path.name == "rank1_step20.json"
    assert parent == private_tmp() and mode == 0o700 and private_tmp().stat().st_uid == os.getuid()
    assert "traceEvents" in trace
    assert not path.parent.exists()   # sent, then removed
