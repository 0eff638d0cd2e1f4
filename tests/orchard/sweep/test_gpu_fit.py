"""Trials that share a GPU, sized by its memory: the sweep's limit from the trials' measured peaks
(orchard/sweep/gpu_fit.py; what a worker logs of its GPU: tests/orchard/tracking/test_gpu_peak.py).
End to end: test_sweep.py's ``test_trials_that_share_a_declared_gpu_run_as_many_at_once_as_its_memory_holds``."""
from __future__ import annotations

from orchard.sweep.gpu_fit import GpuFit, trials_per_gpu


def report(torch_peak, other=500.0, total=80_000.0) -> dict:
    return {"val/mae": 1.0, "system/w0_gpu_torch_peak_mb": torch_peak, "system/w0_gpu_other_mb": other,
            "system/w0_gpu_total_mb": total}


def test_a_gpu_holds_the_trials_whose_peak_at_1_2x_fits_in_90_percent_of_it():
    assert trials_per_gpu(2_500, 500, 80_000) == 20   # 72,000 / 3,600
    assert trials_per_gpu(2_400, 500, 8_000) == 2     # 7,200 / 3,480
    assert trials_per_gpu(90_000, 500, 80_000) == 1   # too big for the GPU: still one at a time


def test_one_trial_until_one_reports_its_peak_then_as_many_as_the_memory_holds():
    fit = GpuFit(share=0.125, shares_limit=8, gpus=1)
    assert fit.limit == 1
    assert fit.seen({"val/mae": 3.0}) is None and fit.limit == 1  # a report without GPU memory
    line = fit.seen(report(12_000))  # 12,500 MiB at 1.2x in 72,000: 4 of the 8 the shares allow
    assert fit.limit == 4 and "up to 4 trial(s) at once (was 1" in line
    assert fit.seen(report(12_000)) is None  # nothing new
    assert fit.seen(report(20_000)) and fit.limit == 2  # a bigger trial (a batch-size grid) lowers it
    assert fit.seen(report(1_000)) is None and fit.limit == 2  # the biggest peak seen holds


def test_where_the_shares_already_keep_a_gpu_within_its_memory_they_decide():
    fit = GpuFit(share=0.5, shares_limit=6, gpus=3)  # two a GPU by shares; memory would hold 20
    fit.seen(report(2_500))
    assert fit.limit == 6


def test_with_several_gpus_the_limit_holds_for_one_and_the_line_says_which_share_uses_them_all():
    # Ray may put every quarter on one GPU: two a GPU by memory means two in all
    fit = GpuFit(share=0.25, shares_limit=16, gpus=4)
    line = fit.seen(report(29_000))  # 29,500 MiB at 1.2x in 72,000: two
    assert fit.limit == 2 and "to run 2 on each of the 4 GPUs, give each trial 0.5 of a GPU" in line


def test_a_finished_trial_that_reported_no_gpu_memory_leaves_the_shares_to_decide():
    fit = GpuFit(share=0.25, shares_limit=4, gpus=1)
    line = fit.ended_unmeasured()
    assert fit.limit == 4 and "no trial reported its GPU memory" in line
    measured = GpuFit(share=0.25, shares_limit=4, gpus=1)
    measured.seen(report(40_000))
    assert measured.ended_unmeasured() is None and measured.limit == 1


def test_the_sweeps_scheduler_fits_gpu_memory_only_for_trials_that_share_a_gpu_and_when_asked():
    from orchard.sweep.trials import scheduler_of

    s = {"scheduler": "fifo", "fit_gpu_memory": True}
    assert scheduler_of(s, 4, gpu_share=0.25, gpus=1).limit == 1  # one, until a trial is measured
    assert scheduler_of({**s, "fit_gpu_memory": False}, 4, gpu_share=0.25, gpus=1).limit == 4
    assert scheduler_of(s, 4, gpu_share=1.0, gpus=4).limit == 4  # a GPU each: nothing shared
    assert scheduler_of(s, 4).limit == 4  # no GPU
