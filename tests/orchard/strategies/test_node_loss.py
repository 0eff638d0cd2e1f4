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

    log = RecoveryLog.remote()
    bound = StartBound(log, bound_s=0.0, poll_s=0.05)
    with bound:
        deadline = time.monotonic() + 30
        while not bound.expired:   # expired, and no controller yet
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)            # a few more looks with no controller to end
        controller = StandIn.remote()
        assert ray_session.get(controller.ping.remote())
        log.controller.remote(controller._actor_id.hex())
        deadline = time.monotonic() + 20
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray_session.get(controller.ping.remote(), timeout=5)
                time.sleep(0.05)
