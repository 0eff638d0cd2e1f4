"""kill_and_confirm: a restartable actor ended for good, its resources back, even when Ray ignores
a kill (what it does to a kill reaching an actor mid-restart: orchard/cluster/actors.py)."""
from __future__ import annotations

import os
import signal

from orchard.cluster.actors import kill_and_confirm
from tests.session_ray import all_cpus_free


def _restartable(ray):
    @ray.remote(num_cpus=0.25, max_restarts=-1, max_task_retries=0)
    class Restartable:
        def pid(self) -> int:
            return os.getpid()

    return Restartable


def _gone(ray, actor) -> bool:
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


def test_actors_killed_while_ray_restarts_them_are_gone_and_their_cpus_free(ray_session):
    ray = ray_session
    actors = [_restartable(ray).remote() for _ in range(3)]
    pids = ray.get([a.pid.remote() for a in actors])
    os.kill(pids[0], signal.SIGKILL)  # Ray restarts it: killed during or just after its restart
    assert kill_and_confirm(actors) == []
    assert all(_gone(ray, a) for a in actors)
    assert all_cpus_free(), ray.available_resources()


def test_a_kill_that_ray_ignored_is_seen_and_made_again(ray_session, monkeypatch):
    """Ray's race cannot be made to happen on cue, so its outcome is: the first kill of each actor
    does nothing. A plain ``ray.kill`` leaves both actors alive holding their CPU shares."""
    ray = ray_session
    actors = [_restartable(ray).remote() for _ in range(2)]
    ray.get([a.pid.remote() for a in actors])
    real_kill, ignored = ray.kill, []

    def kill_ignored_once(actor, no_restart=True):
        if id(actor) not in ignored:
            ignored.append(id(actor))
            return
        real_kill(actor, no_restart=no_restart)

    monkeypatch.setattr(ray, "kill", kill_ignored_once)
    try:
        assert kill_and_confirm(actors, wait_s=5) == []
    finally:
        monkeypatch.undo()
        for actor in actors:
            ray.kill(actor)
    assert len(ignored) == 2
    assert all(_gone(ray, a) for a in actors)
    assert all_cpus_free(), ray.available_resources()


def test_an_actor_that_outlives_every_kill_is_returned_and_said(ray_session, monkeypatch, capsys):
    """Every kill ignored: the caller is told which actor still lives, after ``rounds`` tries,
    and the user in one line."""
    ray = ray_session
    actor = _restartable(ray).remote()
    ray.get(actor.pid.remote())
    kills = []
    monkeypatch.setattr(ray, "kill", lambda a, no_restart=True: kills.append(a))
    try:
        assert kill_and_confirm([actor], rounds=2, wait_s=5) == [actor]
    finally:
        monkeypatch.undo()
        ray.kill(actor)
    assert len(kills) == 2
    assert "1 actor(s) still answer after 2 kills" in capsys.readouterr().err
