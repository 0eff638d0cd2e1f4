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
