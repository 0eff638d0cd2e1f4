"""[2] preflight: what is checked before a run starts anything, each failure one line and exit 2:
Ray's token auth, a fresh run folder, a writable ``output_dir``, the tracking store, a cluster
address that answers (and asks for a token)."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from orchard import config as config_lib
from orchard.errors import ConfigError
from orchard.terminal.console import say


def preflight(cfg: dict, module=None) -> None:
    """Everything that can be checked before Ray starts and a run opens; raises ConfigError.
    With the workload's ``module``, also that its workers fit the machine an embedded Ray would
    have (``check_fits``), so a run that cannot fit is refused in seconds, not after a Ray start."""
    _check_output_dir(cfg["output_dir"])
    _check_ray_auth(cfg["cluster"])
    if cfg["cluster"]["mode"] == "remote":  # first: a 5 s probe, before a store is created or migrated
        _check_cluster_address(cfg["cluster"]["address"], cfg["cluster"])
    elif module is not None:
        from orchard.cluster.ray_private import detected_resources

        have = detected_resources()
        have.update({k.upper(): float(cfg["cluster"][f"num_{k}"]) for k in ("cpus", "gpus")
                     if cfg["cluster"].get(f"num_{k}") is not None})
        check_fits(cfg, module, have)
    from orchard import storage

    storage.check(cfg)  # storage.uri (s3://...) writable with the AWS_* variables given
    _check_fresh_run_folder(cfg)
    if cfg["tracking"]["enabled"]:
        from orchard.tracking.store import check_store

        check_store(cfg["tracking"]["uri"], open_now=False)  # opened beside Ray's start (lifecycle.execute)


def _check_ray_auth(cluster: dict) -> None:
    """Ray listens on every interface, even embedded, and runs whatever code reaches its ports:
    its token is the door (on by default in Ray 2.60). Ray keeps it only while ``RAY_AUTH_MODE``
    is unset or exactly ``token``; any other value (``disabled``, ``off``, ``Token``, empty) turns
    it off, so any other value gets one line instead of an open port, unless
    ``cluster.allow_unauthenticated=true`` says it is meant (an isolated network)."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode not in (None, "token") and not cluster.get("allow_unauthenticated"):
        raise ConfigError("cluster.allow_unauthenticated", f"true to run Ray without its token (RAY_AUTH_MODE={mode!r} "
                          "is set, and Ray keeps its token only while it is unset or 'token': its ports, open on every "
                          "interface, would run anyone's code); or unset RAY_AUTH_MODE")


def _check_fresh_run_folder(cfg: dict) -> None:
    """A new run never trains on from another run's checkpoints by accident: a folder the user
    named (``hydra.run.dir``) that an earlier run already trained in is refused, not shared
    (Ray Train would restore whatever its storage holds). Only ``resume`` continues a run."""
    if not cfg.get("_run_dir") or config_lib.RUN_ID in cfg["_run_dir"] or cfg.get("_resumes"):
        return  # a folder named by the run's own id is new by construction
    from orchard.storage import Storage

    kept = Storage.for_run(cfg, Path(cfg["_run_dir"]).resolve())
    if kept.exists():
        raise ConfigError("hydra.run.dir", f"a folder no earlier run trained in; {cfg['_run_dir']} holds a run's "
                          f"checkpoints ({kept.uri}): continue it with python -m orchard resume <its run id>, "
                          "or name another folder")


def _check_output_dir(output_dir: str) -> None:
    try:
        config_lib.ensure_writable(Path(os.path.expanduser(str(output_dir))))
    except OSError as exc:
        raise ConfigError("output_dir", f"a folder orchard can create and write; {str(output_dir)!r}: "
                          f"{exc.strerror or exc}") from None


def _check_cluster_address(address: str, cluster: dict, timeout_s: float = 5.0) -> None:
    """A Ray cluster must answer at ``address`` (host:port, ray://host:port) or be found (auto),
    and a cluster reached at its GCS address must be Ray's GCS and ask for Ray's token (``check_gcs``)."""
    if address in (None, "auto"):
        # Ray's own lookup order: RAY_ADDRESS, then the cluster `ray start` last left on this
        # machine; that file outlives its cluster, so the address it names is checked below.
        latest = Path("/tmp/ray/ray_current_cluster")
        found = os.environ.get("RAY_ADDRESS") or (latest.read_text().strip() if latest.exists() else "")
        if not found or found == "auto":
            raise ConfigError("cluster.address", "auto needs a Ray cluster on this machine (ray start --head) "
                              "or RAY_ADDRESS; none found. Give host:6379 or ray://host:10001")
        address = found
    hostport = str(address).split("://", 1)[-1].rstrip("/")
    host, colon, port = hostport.rpartition(":")
    if not colon:  # no port: Ray's own (Ray Client's server for ray://, the GCS's otherwise)
        host, port = hostport, ""
    port = port or ("10001" if "://" in str(address) else "6379")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise ConfigError("cluster.address", f"a Ray cluster that answers; none did at {address} "
                          f"({getattr(exc, 'strerror', None) or exc})") from None
    if "://" not in str(address):
        check_gcs(f"{host}:{int(port)}", cluster)


# What a server that took the probe's connection but is no Ray GCS answers its gRPC call: not
# HTTP/2 at all (a dashboard's port, 8265; any web server), or HTTP/2 without Ray's GCS service
# (Ray Client's port, 10001, given without ray://; a proxy's 404). Ray's own connect retries such
# an address for many minutes, deaf to Ctrl-C and SIGTERM inside its C++ client (13 min to an
# HTTP server, 2026-12-07): refused here instead
NOT_A_GCS = ("UNAVAILABLE", "UNIMPLEMENTED")


def check_gcs(gcs_address: str, cluster: dict) -> None:
    """Ray's GCS answers at ``gcs_address``, and asks for a token. A server there that is not a
    GCS (``NOT_A_GCS``) is one line naming ``cluster.address``. A cluster on another machine
    started without token auth (its head without a token, or with ``RAY_AUTH_MODE=disabled``) is
    refused like starting one: its ports run the code of anyone who reaches them, the run's
    included. One on this machine (a ``ray start`` or ``cluster_utils.Cluster`` of the user's own,
    for trying things) gets one line saying so and is used. A ``ray://`` address reaches Ray
    Client's server, whose GCS port the client does not know: not probed (docs/cluster.md,
    "Security")."""
    import grpc

    from orchard.cluster import ray_private

    try:
        open_door = ray_private.answers_without_token(gcs_address)
    except grpc.RpcError as exc:
        # the probe's channel has no TLS: a GCS that speaks only TLS (RAY_USE_TLS) fails it too
        tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
        if exc.code().name in NOT_A_GCS and not tls:
            raise ConfigError("cluster.address", f"a Ray cluster's GCS (host:6379 unless its head was started with "
                              f"another --port; Ray Client's port takes ray://host:10001); {gcs_address} answered, "
                              f"but not as Ray's GCS ({(exc.details() or exc.code().name).splitlines()[0][:200]})"
                              ) from None
        return  # a GCS slow to answer: Ray's own connect decides
    if not open_door or cluster.get("allow_unauthenticated"):
        return
    if _on_this_machine(gcs_address.rpartition(":")[0]):
        say(f"orchard: the Ray cluster at {gcs_address} runs without token auth: anyone who reaches its ports "
            "can run code there (docs/cluster.md, 'Starting a cluster with token auth on')", file=sys.stderr)
        return
    raise ConfigError("cluster.allow_unauthenticated", f"true to attach to {gcs_address}, a Ray cluster without "
                      "token auth (it answers without a token: its ports run anyone's code); or restart it with "
                      "auth on (docs/cluster.md, 'Starting a cluster with token auth on')")


def _on_this_machine(host: str) -> bool:
    """``host`` names this machine: a loopback address or one of its interfaces' addresses."""
    import ipaddress

    import psutil

    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    own = {a.address.split("%")[0] for nics in psutil.net_if_addrs().values() for a in nics}
    return all(ipaddress.ip_address(a).is_loopback or a in own for a in addresses)


def check_fits(cfg: dict, module, have: dict | None = None) -> None:
    """The workers a run starts all at once (a Ray Train group, SPREAD actors: the workload's
    ``resources(cfg).outside``) must fit the embedded Ray, or they would wait forever for a
    placement group; raises ConfigError.  ``have``: the resources Ray will have (preflight,
    before it starts), else the running Ray's.  Attached clusters may autoscale: not checked."""
    import ray

    resources_fn = getattr(module, "resources", None)
    if resources_fn is None or cfg["cluster"]["mode"] != "local":
        return
    try:
        outside = resources_fn(cfg).outside
    except ray.exceptions.RaySystemError:
        if have is None:
            raise
        return  # a workload that sizes its groups to the running Ray (singa) is checked once it is up
    need: dict[str, float] = {}
    for bundle in outside:
        for key, value in bundle.items():
            need[key] = need.get(key, 0.0) + float(value)
    if have is None:
        have = ray.cluster_resources()
    short = [f"{value:g} {key} (this machine's Ray has {float(have.get(key, 0)):g})"
             for key, value in need.items() if value > float(have.get(key, 0)) + 1e-9]
    if short:
        raise ConfigError("strategy", f"workers that fit this machine; they need {', '.join(short)} at once: "
                          "lower strategy.num_workers / cpus_per_worker / gpus_per_worker, or raise cluster.num_cpus")
