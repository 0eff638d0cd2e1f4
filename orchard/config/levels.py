"""The levels ``cluster.ray_log_level`` takes, apart from the schema: every Ray worker process
imports ``orchard.cluster.ray_logging`` (its setup hook), and the schema's pydantic would add
~0.1 s of CPU to each one's start (a run starts 7-20 of them)."""

LIBRARY_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
