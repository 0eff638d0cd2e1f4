"""orchard/run/ending.py: what the summary of a run that did not finish tells its user to do next: the
key to change after a divergence, and what a resume must be given again."""
from __future__ import annotations

from pathlib import Path

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


def _workload(resume=None):
    from types import SimpleNamespace

    return SimpleNamespace(**({"resume": resume} if resume else {}))


def _refused_by(key):
    def resume(cfg, run_dir):
        from orchard.errors import ConfigError

        cfg["changed"] = True  # a workload's resume writes into the config it is given
        raise ConfigError(key, "a run folder holding a checkpoint")
    return resume


@pytest.mark.parametrize("module,key,want", [
    # the workload's resume takes the run: resume it with another value
    (_workload(lambda cfg, run_dir: None), "tiny.steps",
     "resume:    with another tiny.steps: python -m orchard resume RUN tiny.steps=..."),
    # its resume refuses only the value being changed (flower and video validate it again)
    (_workload(_refused_by("tiny.steps")), "tiny.steps",
     "resume:    with another tiny.steps: python -m orchard resume RUN tiny.steps=..."),
    # nothing to resume from (forest and singa before their first checkpoint), or no resume at all
    (_workload(_refused_by("tiny.resume")), "tiny.steps",
     "again:     with another tiny.steps: python -m orchard workload=tiny 'tiny.note=x y' tiny.steps=..."),
    (_workload(), "tiny.steps",
     "again:     with another tiny.steps: python -m orchard workload=tiny 'tiny.note=x y' tiny.steps=..."),
    # a key no command line can change says nothing more than the error line did
    (_workload(lambda cfg, run_dir: None), "run id", None),
])
def test_a_refused_config_value_is_offered_again_only_with_another_value(module, key, want):
    from orchard.errors import ConfigError
    from orchard.run.ending import _config_error_hint

    cfg = {"_overrides": ["workload=tiny", "tiny.steps=7", "tiny.note=x y"], "tracking": {"uri": "sqlite:///mlflow.db"}}
    assert _config_error_hint(cfg, module, "RUN", Path("/runs/RUN"), ConfigError(key, "no")) == ([want] if want else [])
    assert "changed" not in cfg  # the probe ran on a copy


def test_a_resume_with_another_value_does_not_repeat_the_refused_one():
    """cluster.num_cpus is off a resume's allow-list, so a plain resume line gives it again; the
    line that asks for another value must not give the old one beside it."""
    from orchard.errors import ConfigError
    from orchard.run.ending import _config_error_hint

    cfg = {"_overrides": ["workload=tiny", "cluster.num_cpus=1", "output_dir=/o"], "tracking": {"uri": "sqlite:///mlflow.db"}}
    assert _config_error_hint(cfg, _workload(lambda cfg, run_dir: None), "RUN", Path("/runs/RUN"),
                              ConfigError("cluster.num_cpus", "no")) == [
        "resume:    with another cluster.num_cpus: python -m orchard resume RUN cluster.num_cpus=... output_dir=/o"]


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
