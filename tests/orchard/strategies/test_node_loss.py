"""node_loss.StartBound: the start bound orchard keeps for an elastic Ray Train group. The wait is
counted from before the controller starts; a bound that expires before the controller told its
id keeps looking and ends the controller once it has, rather than end nothing and look no more."""
import time

import pytest
import ray


@ray.remote(num_cpus=0)
class StandIn:
    """Stands in for Ray Train's controller actor."""

    def ping(self) -> bool:
        return True


@pytest.mark.slow
def test_a_bound_that_expired_before_the_controller_started_ends_it_once_it_has(ray_session):
    from orchard.strategies.node_loss import RecoveryLog, StartBound

    log = RecoveryLog()
    bound = StartBound(log, bound_s=0.0, poll_s=0.05)
    with bound:
        deadline = time.monotonic() + 30
        while not bound.expired:   # expired, and no controller yet
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)            # a few more looks with no controller to end
        controller = StandIn.remote()
        assert ray_session.get(controller.ping.remote())
        log.controller(controller._actor_id.hex())
        deadline = time.monotonic() + 20
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray_session.get(controller.ping.remote(), timeout=5)
                time.sleep(0.05)


def test_the_recovery_log_times_the_wait_and_numbers_each_groups_start_from_any_process(ray_session):
    """What the launcher reads back: the wait counted from the first waiting state (not moved by
    the next one), cleared once a group runs; each group's start numbered in order, whichever
    process (a Train worker's rank 0) noted it; nothing left once closed."""
    from orchard.strategies.node_loss import RecoveryLog

    log = RecoveryLog()
    assert log.waiting_since() is not None        # no group runs yet
    log.state("RUNNING", 10.0)
    assert log.waiting_since() is None
    log.state("RESTARTING", 20.0)
    log.state("RESCHEDULING", 25.0)
    assert log.waiting_since() == 20.0

    @ray.remote(num_cpus=0)
    def rank_zero(log, epoch):
        return log.started(2, epoch, 30.0)

    assert log.started(2, None, 5.0) == 1
    assert ray_session.get(rank_zero.remote(log, 3)) == 2
    assert log.read() == [{"world_size": 2, "restored_epoch": None, "at": 5.0},
                          {"world_size": 2, "restored_epoch": 3, "at": 30.0}]
    log.close()
    assert log.read() == [] and log.waiting_since() is None
