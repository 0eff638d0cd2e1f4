"""The test session's Ray (tests/conftest.py ``ray_session``), as a place other processes attach to."""


def attach_overrides() -> list[str]:
    """``cluster=remote`` at the session's Ray: a ``python -m orchard`` process given these joins
    it as a user's joins a cluster (docs/cluster.md) instead of starting and stopping a Ray of its own."""
    import ray

    assert ray.is_initialized(), "attach_overrides() needs the ray_session fixture"
    return ["cluster=remote", f"cluster.address={ray.get_runtime_context().gcs_address}"]
