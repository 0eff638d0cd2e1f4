"""orchard/strategies/process_group.py: Ray Train's torch process group from a module a Train
controller can unpickle without importing torch (2 s of its CPU before it started a worker)."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str):
    """``code`` run in a fresh interpreter (what it imports and its nice value are its own); it must succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.mark.slow
def test_the_config_and_its_backend_travel_without_torch():
    # what the controller unpickles: the config and its backend class, by reference to this module
    code = ("import pickle, sys\n"
            "from orchard.strategies.process_group import ProcessGroupConfig\n"
            "config = pickle.loads(pickle.dumps(ProcessGroupConfig(backend='gloo')))\n"
            "backend = config.backend_cls()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "print(config.to_dict(), backend.share_cuda_visible_devices)\n")
    out = _python(code)
    assert out.stdout.strip() == "{'backend': 'gloo', 'init_method': 'env', 'timeout_s': 1800, 'niceness': 0} True"


def test_a_worker_lowers_its_priority_once_by_the_configured_step():
    # a group started again in the same worker process (a restart) must not lower it twice
    code = ("import os\n"
            "from orchard.strategies.process_group import _rendezvous_at, lower_priority\n"
            "start = os.nice(0)\n"
            "_rendezvous_at('10.0.0.7', 29500, niceness=2)\n"
            "after = os.nice(0)\n"
            "_rendezvous_at('10.0.0.7', 29500, niceness=2)\n"
            "lower_priority(0)\n"
            "again = os.nice(0)\n"
            "lower_priority(3)\n"
            "print(after - start, again - start, os.nice(0) - start, os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])\n")
    out = _python(code)
    assert out.stdout.split() == ["2", "2", "3", "10.0.0.7", "29500"]
