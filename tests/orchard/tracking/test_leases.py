"""Leases on a real MLflow sqlite store: one driver at a time for a resume or a sweep."""
import json
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from orchard.tracking import leases


@pytest.fixture
def run(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("leases")
    return client, client.create_run(exp).info.run_id


def test_a_live_lease_refuses_a_second_taker_and_names_the_holder(run):
    client, run_id = run
    held = leases.take(client, run_id, "the resume of run x", settle_s=0)
    with pytest.raises(leases.LeaseHeld) as refused:
        leases.take(client, run_id, "the resume of run x", settle_s=0)
    text = str(refused.value)
    assert "the resume of run x is already driven by pid" in text and "since" in text
    held.release()
    assert leases.read(client, run_id) is None  # released: the next taker gets it
    leases.take(client, run_id, "the resume of run x", settle_s=0).release()


@pytest.mark.slow
def test_a_lease_whose_driver_is_gone_is_taken_over_with_a_line(run, capsys):
    client, run_id = run
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = json.loads(json.dumps(leases._record("dead", "sweep k", 0)))
    record["pid"] = gone.stdout.strip()  # a process of this machine that has ended
    client.set_tag(run_id, leases.TAG, json.dumps(record))
    assert not leases.alive(leases.read(client, run_id))
    lease = leases.take(client, run_id, "sweep k", settle_s=0)
    assert "taking over sweep k" in capsys.readouterr().err
    assert leases.read(client, run_id)["token"] == lease.token
    lease.release()


def test_of_two_takers_at_once_only_the_last_writer_keeps_it(run, monkeypatch):
    """Write-then-verify: a taker whose token is overwritten while it settles backs off."""
    client, run_id = run
    rival = leases.Lease(client, run_id, "sweep k")
    monkeypatch.setattr(leases.time, "sleep", lambda s: rival._write())  # the rival writes meanwhile
    with pytest.raises(leases.LeaseHeld):
        leases.take(client, run_id, "sweep k")
    assert leases.read(client, run_id)["token"] == rival.token


def test_without_a_store_the_lease_is_a_lock_on_the_folder_that_names_its_holder(tmp_path):
    """tracking=none: the same sweep twice on one machine is refused naming the first driver; the
    lock goes with its holder (released, or its process gone), so the next one takes it."""
    import os

    first = leases.take_local(tmp_path, "sweep s-1")
    with pytest.raises(leases.LeaseHeld, match=f"sweep s-1 is already driven by pid {os.getpid()} on "):
        leases.take_local(tmp_path, "sweep s-1")
    first.release()
    leases.take_local(tmp_path, "sweep s-1").release()


def test_a_lease_with_a_heartbeat_in_the_future_is_forged_and_taken_over(tracking_uri, capsys):
    """Whoever can write a tag could plant a lease beating a year ahead: it would hold off every
    resume for ever. No driver writes one (beats are on the store's clock): taken over, said so."""
    import time

    from orchard.tracking.mlflow_run import ensure_experiment

    client = MlflowClient(tracking_uri)  # the session's store: no store of its own to create
    run_id = client.create_run(ensure_experiment(client, "leases", None)).info.run_id
    record = leases._record("forged", "the resume of run x", 0)
    record.update(host="elsewhere", beat=f"{time.time() + 365 * 86400:.0f}")
    client.set_tag(run_id, leases.TAG, json.dumps(record))
    assert leases.forged(leases.read(client, run_id)) and not leases.alive(leases.read(client, run_id))
    lease = leases.take(client, run_id, "the resume of run x", settle_s=0)
    assert "heartbeat is in the future (forged)" in capsys.readouterr().err
    assert leases.read(client, run_id)["token"] == lease.token
    lease.release()
    record.update(beat=f"{time.time() + 5:.0f}")  # a few seconds of clock skew is no forgery
    assert not leases.forged(record)
