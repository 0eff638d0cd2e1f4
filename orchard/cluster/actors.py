"""Ending actors for good: a kill that Ray may ignore, seen through.

Ray can ignore a ``ray.kill`` that reaches a restartable actor (``max_restarts``) while Ray is
restarting it after a fault: the kill goes to the new worker process before that process is the
actor ("Mismatched ActorID: ignoring KillActor for previous actor" in its log), and the restarted
actor then lives, holding its resources, for as long as the job does. In a test session's 2-CPU
Ray a forest histogram actor killed so kept 0.25 CPU, and a later run's worker groups never
started (2026-12-05). Every actor a run starts with restarts is ended here: killed, asked whether
it still answers, and killed again while it does.
"""
from __future__ import annotations

import sys

import ray

from orchard.terminal.console import say

ROUNDS = 5  # kills before giving up on an actor; one was enough in every run seen
ANSWER_WAIT_S = 10.0  # a round's wait for all the actors' answers at once


def kill_and_confirm(actors: list, rounds: int = ROUNDS, wait_s: float = ANSWER_WAIT_S) -> list:
    """Kill ``actors`` (no restart) and return those still alive after ``rounds`` kills: none
    unless Ray ignored every kill. Each round kills all of them, asks all at once whether they
    answer (Ray's own ``__ray_ready__``, which every actor has), and keeps those that answered
    (restarted behind the kill) or have not answered yet (still restarting) for the next. An
    actor that is gone answers ``RayActorError`` at once; a round waits ``wait_s`` at most. One
    that outlived every kill is said on the terminal: it holds its resources until Ray stops."""
    left = list(actors)
    for _ in range(rounds):
        if not left:
            break
        for actor in left:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - its job or session is gone already: the others still
                pass
        answers = [actor.__ray_ready__.remote() for actor in left]
        ray.wait(answers, num_returns=len(answers), timeout=wait_s)
        still = []
        for actor, answer in zip(left, answers):
            try:
                ray.get(answer, timeout=0)
                still.append(actor)  # alive after its kill: restarted behind it
            except ray.exceptions.RayActorError:
                pass  # gone
            except ray.exceptions.GetTimeoutError:
                still.append(actor)  # still restarting: killed again
        left = still
    if left:
        say(f"orchard: {len(left)} actor(s) still answer after {rounds} kills (Ray ignored them); they hold "
            "their CPUs until this Ray stops", file=sys.stderr)
    return left
