"""A forest task in a worker whose current folder was removed (a lost node's end removes the job's
working_dir copy that a cluster_utils node's workers share) still compiles its numba kernels."""
import os
import tempfile

import numba
import pytest


@pytest.fixture
def gone_folder(tmp_path):
    here = os.getcwd()
    gone = tmp_path / "working_dir_copy"
    gone.mkdir()
    os.chdir(gone)
    gone.rmdir()
    try:
        yield
    finally:
        os.chdir(here)


def _fresh_kernel():
    @numba.njit
    def add(a, b):
        return a + b
    return add


def test_in_a_removed_folder_what_numbas_compiler_calls_fails(gone_folder):
    # numba.core.ir.Loc._get_path: os.path.relpath(filename), which asks for the current folder
    with pytest.raises(FileNotFoundError):
        os.path.relpath(__file__)


def test_a_task_starting_in_a_removed_folder_moves_to_the_temp_folder_and_compiles(gone_folder):
    from workloads.forest.round_tasks import _ready_for_numba

    _ready_for_numba(1)   # what encode_task, phase1_task and phase2_task do first
    assert os.getcwd() == os.path.realpath(tempfile.gettempdir())
    os.path.relpath(__file__)
    assert _fresh_kernel()(1, 2) == 3
