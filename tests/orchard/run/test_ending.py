"""orchard/run/ending.py: what the summary of a run that did not finish tells its user to do next: the
key to change after a divergence, and what a resume must be given again."""
from __future__ import annotations

import pytest

from orchard.errors import Diverged


@pytest.mark.parametrize("checkpoint,resumes,want", [
    (True, None, "resume:    with a lower singa.lr: python -m orchard resume RUN singa.lr=..."),
    (False, "OLD", "resume:    with a lower singa.lr: python -m orchard resume OLD singa.lr=..."),
    (False, None, "again:     with a lower singa.lr (no checkpoint before it diverged): "
                  "python -m orchard workload=singa debug=smoke singa.lr=..."),
])
def test_the_summary_offers_to_go_on_only_with_a_new_value_for_the_key(checkpoint, resumes, want):
    from orchard.run.ending import _diverged_hint
    from workloads import singa

    cfg = {"_overrides": ["workload=singa", "debug=smoke", "singa.lr=1e30"], "tracking": {"uri": "sqlite:///mlflow.db"},
           **({"_resumes": resumes} if resumes else {})}
    err = Diverged("loss", "NaN", 1, 3, "singa.lr", 1e30, checkpoint=checkpoint)
    assert _diverged_hint(cfg, singa, "RUN", err) == [want]


def test_the_summary_says_what_a_resume_must_be_given(monkeypatch):
    from orchard.run.ending import _resume_args

    monkeypatch.setattr("orchard.config.registry.user_config_dirs", lambda: [])
    cfg = {"tracking": {"uri": "sqlite:////s/m.db"}, "_overrides": [
        "workload=tiny", "tiny.steps=7", "output_dir=/o", "+cluster.runtime_env.env_vars.T=secret", "tracking.uri=x"]}
    assert _resume_args(cfg) == (" tracking.uri=sqlite:////s/m.db output_dir=/o "
                                 "'+cluster.runtime_env.env_vars.T=***'")


def test_the_runs_node_counts_are_the_whole_runs_and_never_below_its_workloads():
    """The run's node watch (LiveServices.nodes) is stopped as the run ends and what it saw goes
    into the final metrics: the larger of its count and the workload's own watch's (which looks
    only while its training runs); nothing added where it saw nothing."""
    from orchard.run.ending import _nodes_seen

    class Seen:
        def __init__(self, lost, joined):
            self.nodes_lost, self.joined, self.stopped = lost, joined, False

        def stop(self):
            self.stopped = True

    quiet, busy = Seen(0, 0), Seen(2, 1)
    assert _nodes_seen(None, {}) == {}
    assert _nodes_seen(quiet, {"cluster/nodes_lost": 0.0}) == {} and quiet.stopped
    assert _nodes_seen(busy, {"cluster/nodes_lost": 1.0}) == {"cluster/nodes_lost": 2.0, "cluster/nodes_joined": 1.0}
    assert _nodes_seen(Seen(1, 0), {"cluster/nodes_lost": 3.0, "cluster/nodes_joined": 2.0}) == \
        {"cluster/nodes_lost": 3.0, "cluster/nodes_joined": 2.0}
