"""orchard/cluster/placement.py on its own: the bundles a workload declares, what one trial holds
in all, the line that describes it, and the refusal when not one trial fits. Plain numbers, no Ray
cluster (a trial's placement group and the concurrency limit on a cluster: test_sweep.py)."""
import pytest

from orchard.cluster.placement import HEAD, Resources, bundles
from orchard.errors import ConfigError


def test_bundles_leave_out_the_resources_they_do_not_ask_for():
    assert bundles(2, 1.0) == ({"CPU": 1.0}, {"CPU": 1.0})
    assert bundles(1, cpu=0, gpu=1) == ({"GPU": 1.0},)
    assert bundles(3, cpu=0, gpu=0) == ()   # nothing asked: no empty bundles Ray would refuse
    two = bundles(2, 0.5)
    two[0]["CPU"] = 9.0
    assert two[1] == {"CPU": 0.5}   # each its own dict


def test_one_trial_holds_its_head_and_every_bundle_inside_and_outside_its_group():
    need = Resources(in_trial=bundles(2, 0.5), outside=bundles(3, 1.0, gpu=0.5))
    assert need.per_trial() == {"memory": float(HEAD["memory"]), "CPU": 4.0, "GPU": 1.5}


def test_the_trials_placement_group_drops_bundles_that_ask_for_nothing():
    assert Resources(in_trial=({"CPU": 0.0}, {"CPU": 1.0})).factory().bundles == [HEAD, {"CPU": 1.0}]


def test_the_console_line_counts_alike_bundles_and_says_nothing_where_there_are_none():
    need = Resources(in_trial=(*bundles(2, 1.0), {"CPU": 1.0, "GPU": 1.0}))
    assert need.describe() == ("in the trial's placement group 2 x {CPU: 1} + 1 x {CPU: 1, GPU: 1}; "
                               "outside it nothing")


def test_a_trial_too_big_for_the_cluster_is_refused_naming_what_is_short_and_what_to_change():
    need = Resources(outside=bundles(4, 1.0, gpu=1.0))
    with pytest.raises(ConfigError) as err:
        need.max_concurrent({"CPU": 8.0, "GPU": 2.0, "memory": 8 * 2**30})
    assert err.value.key == "sweep"
    assert err.value.allowed == ("a cluster that holds one trial; one trial needs GPU 4 (cluster: 2) "  # CPU fits
                                 "(in the trial's placement group nothing; outside it 4 x {CPU: 1, GPU: 1}); "
                                 "fewer workers (strategy.num_workers) or a bigger cluster")


def test_fractional_bundles_that_add_up_to_the_cluster_fit_exactly():
    """Three 0.1-CPU bundles are 0.30000000000000004 CPU in floats: still one trial on 0.3 CPU."""
    need = Resources(in_trial=bundles(3, 0.1))
    assert need.max_concurrent({"CPU": 0.3, "memory": float(HEAD["memory"])}) == 1
