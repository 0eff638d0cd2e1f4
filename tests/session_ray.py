"""The test session's Ray (tests/conftest.py ``ray_session``), as a place other processes attach to."""


def attach_overrides() -> list[str]:
    """``cluster=remote`` at the session's Ray: a ``python -m orchard`` process given these joins
    it as a user's joins a cluster (docs/cluster.md) instead of starting and stopping a Ray of its own."""
    import ray

    assert ray.is_initialized(), "attach_overrides() needs the ray_session fixture"
    return ["cluster=remote", f"cluster.address={ray.get_runtime_context().gcs_address}"]


def all_cpus_free(within_s: float = 30.0) -> bool:
    """Every CPU of the session's Ray free again within ``within_s`` (a kill's release is not
    instant): nothing a test ended is left holding CPUs that later tests' runs would wait for."""
    import time

    import ray

    deadline = time.time() + within_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True
