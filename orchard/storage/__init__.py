"""One storage location for everything a run makes and a Ray worker reads (``storage.uri``).

On one machine it is a folder (``output_dir`` by default, today's layout); on a cluster without
a shared disk it is any URI pyarrow's filesystems take: ``s3://bucket/prefix``, ``gs://...``,
``abfs://...``, or a mounted path.  S3-compatible stores (MinIO, Ceph, moto) are reached through
the standard AWS environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``), read by pyarrow on every node.

Layout under the root (the same on a folder and in a bucket)::

    <root>/<workload>/<run key>/...      one run: checkpoints, worker summaries, the model
                                         (the key: its MLflow run id, or run_key())
    <root>/<workload>/<run key>/train/   (flower/video/singa) Ray Train storage of that run
    <root>/flower_data/synthetic-<key>/  content-keyed caches shared by runs and nodes
    <root>/forest_data/avatars-<key>/    (forest's rendered corpus; video keeps its own under video/)
    <root>/sweeps/<key>/                 Tune's experiment state

A ``Storage`` is a small picklable value (a URI): pass it into Ray tasks, actors and Train
workers, never a driver path.  Workers that need files as files (memory maps, video decoders)
call ``localize()``, which copies a folder once per node into a node-local cache (a local root
is used in place: no copy). That cache is bounded (``storage.node_cache_max_gb``): the least
recently used copies go first (``evict_node_cache``).

Every local file is written whole (``write_atomic``: a temporary name, fsync, rename), so a kill
or a full disk never leaves half a checkpoint for ``resume`` or ``mode=predict`` to read; a write
the disk refuses raises ``StorageFull``, one line naming the file (docs/runs.md, "Bounds").
"""
from __future__ import annotations

from orchard.storage.atomic import (PARTIAL_PREFIX, StorageFull, atomic_file, atomic_folder, clean_partials,
                                    partial_name, write_atomic)
from orchard.storage.location import (Storage, UnsafeKey, check, file_exists, inside, is_uri, read_file, run_key,
                                      run_kept, write_file)
from orchard.storage.node_cache import evict_node_cache, evicted_bytes, node_cache_dir, NODE_CACHE_MAX_BYTES

__all__ = ["NODE_CACHE_MAX_BYTES", "PARTIAL_PREFIX", "Storage", "StorageFull", "UnsafeKey", "atomic_file",
           "atomic_folder", "check", "clean_partials", "evict_node_cache", "evicted_bytes", "file_exists", "inside",
           "is_uri", "node_cache_dir", "partial_name", "read_file", "run_key", "run_kept", "write_atomic",
           "write_file"]
