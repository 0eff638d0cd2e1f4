"""The seal on a sweep's saved Tune state (orchard/sweep/seal.py): a resume reads back only the
files this user's driver wrote; a planted, changed or missing file, a seal made with another
key, no seal, or a key others can read are refused, each with its reason."""
import os

import pytest

from orchard.storage import Storage
from orchard.sweep import seal as sweep_seal


@pytest.fixture
def sealed_state(tmp_path, monkeypatch):
    """A Tune-like experiment folder in storage, sealed from its staging copy with this user's key."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    staging, stored = tmp_path / "staging", tmp_path / "stored"
    for folder in (staging, stored):
        (folder / "trial_0").mkdir(parents=True)
        (folder / "experiment_state-1.json").write_text('{"trial_data": []}')
        (folder / "trial_0" / "result.json").write_text("{}\n")
    (stored / sweep_seal.MARKER).write_bytes(b"")
    (stored / "tuner.pkl").write_bytes(b"pickled tuner")
    state = Storage(stored)
    sweep_seal.seal(state, {"tuner.pkl": sweep_seal.digest(b"pickled tuner"), **sweep_seal.local_digests(staging)})
    return state, stored


def test_sealed_state_verifies_and_the_key_is_private(sealed_state):
    state, _ = sealed_state
    assert set(sweep_seal.verify(state)) == {"tuner.pkl", "experiment_state-1.json", "trial_0/result.json",
                                             sweep_seal.MARKER}
    assert os.stat(sweep_seal.key_path()).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("tamper, reason", [
    (lambda d: (d / "trial_0" / "error.pkl").write_bytes(b"planted"), "did not write: trial_0/error.pkl"),
    (lambda d: (d / "tuner.pkl").write_bytes(b"another pickle"), "changed since it was sealed: tuner.pkl"),
    (lambda d: (d / "experiment_state-1.json").unlink(), "misses a sealed file: experiment_state-1.json"),
    (lambda d: (d / sweep_seal.SEAL).unlink(), "is not sealed"),
    (lambda d: sweep_seal.key_path().write_text("00" * 32), "another key"),
    (lambda d: sweep_seal.key_path().chmod(0o644), "yours alone"),
], ids=["planted", "changed", "missing", "no-seal", "other-key", "readable-key"])
def test_state_this_user_did_not_seal_is_refused_with_its_reason(sealed_state, tamper, reason):
    state, stored = sealed_state
    tamper(stored)
    with pytest.raises(sweep_seal.Unsealed, match=reason.replace(".", r"\.")):
        sweep_seal.verify(state)


def test_an_object_planted_in_the_bucket_beside_sealed_state_is_refused(s3_env, monkeypatch, tmp_path):
    """The issue's case: the sweep's state in a bucket a teammate can write (a moto S3 server)."""
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    state = Storage("s3://orchard/sweeps/flower-flower_lr-1a2b3c4d/tune")
    state.write_bytes("tuner.pkl", b"pickled tuner")
    state.write_bytes("trial_0/result.json", b"{}\n")
    state.write_bytes(sweep_seal.MARKER, b"")
    sweep_seal.seal(state, {"tuner.pkl": sweep_seal.digest(b"pickled tuner"),
                            "trial_0/result.json": sweep_seal.digest(b"{}\n")})
    assert set(sweep_seal.verify(state)) == {"tuner.pkl", "trial_0/result.json", sweep_seal.MARKER}
    state.write_bytes("trial_0/error.pkl", b"planted")
    with pytest.raises(sweep_seal.Unsealed, match="did not write: trial_0/error.pkl"):
        sweep_seal.verify(state)
