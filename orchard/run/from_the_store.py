"""What ``resume`` takes back from the tracking store: an allow-list.

A resume re-runs the overrides a run recorded (its ``orchard.overrides`` tag), and whoever can
write a tag (a teammate on a team server without auth) can plant any override there. So a
resume takes back only the keys that say *what* the run is: its workload and that workload's
own section, its strategy, its debug preset and experiment, its seed, how its progress shows.
Everything else (where it runs, reads and writes: ``cluster``, ``storage``, ``output_dir``,
``tracking``; its environment; the modules it imports; Hydra's own keys) is taken from the
command line only, and a resume names what it held back (orchard/run/resume.py). A value holding
``${`` is never taken: it would be resolved on the resumer's machine (``${oc.env:...}``).
"""
from __future__ import annotations

from orchard.config import redact

# Keys taken back as they are, and sections taken back with every key under them.
TAKEN_KEYS = ("workload", "debug", "experiment", "seed", "progress", "verbose")
TAKEN_SECTIONS = ("strategy",)  # and the workload's own section
# Keys of a workload's section that name Python modules to import: code, never from the store.
CODE_SUFFIX = "_modules"


def key_of(item: str) -> str:
    """The dotted key of an override (``+a.b=1`` -> ``a.b``)."""
    return item.split("=", 1)[0].strip().lstrip("+~")


def taken(item: str, workload: str | None) -> bool:
    """Whether a resume re-applies the recorded override ``item`` of a ``workload`` run."""
    key = key_of(item)
    section = key.split(".", 1)[0]
    allowed = key in TAKEN_KEYS or section in TAKEN_SECTIONS or (
        section == workload and "." in key and not key.endswith(CODE_SUFFIX))
    return allowed and "${" not in item and redact.MASK not in item


def workload_of(items: list[str]) -> str | None:
    """The workload an override list names (its last ``workload=``), if any."""
    named = [i.split("=", 1)[1] for i in items if key_of(i) == "workload" and "=" in i]
    return named[-1] if named else None


def held_back(recorded: list[str], given: list[str]) -> list[str]:
    """The recorded overrides a resume does not take back (``taken``) and the command line
    (``given``) does not set again: what it must be told again."""
    workload = workload_of(given) or workload_of(recorded)
    again = {key_of(o) for o in given}
    return [o for o in recorded if key_of(o) not in again and not taken(o, workload)]
