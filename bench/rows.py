"""One row of a results file: orchard and its peer on the same work, with their quality.

A bench returns `row(...)` dicts holding the per-repeat values; `summarize` adds median, min
and max and the ratio. `ratio` is always orchard's speed as a multiple of the peer's (above 1:
orchard is faster), whatever the unit, so a reader never has to know which way a unit points.
"""
from __future__ import annotations

import importlib.util
import math
import statistics


def row(name: str, unit: str, orchard: list[float], peer: list[float] | None, *, orchard_label: str,
        peer_label: str | None, higher_is_better: bool, quality: dict | None = None,
        target: dict | None = None, status: str = "ok", note: str = "") -> dict:
    """A measured row: `orchard`/`peer` hold one value per repeat in `unit`.

    quality: {"orchard": {...}, "peer": {...}} accuracy or output equality of each side.
    target: {"text": "...", "min_ratio": float, "quality_ok": bool (optional)}, or
            {"text": "...", "met": bool} for an orchard-only bound.
    """
    def finite(values):
        kept = [float(v) for v in values or [] if v is not None and math.isfinite(float(v))]
        if len(kept) < len(values or []):  # say so rather than let NaN reach the table or the JSON
            dropped.append(len(values) - len(kept))
        return kept

    dropped: list[int] = []
    out = {"name": name, "unit": unit, "higher_is_better": higher_is_better, "status": status,
           "orchard": {"label": orchard_label, "values": finite(orchard)},
           "peer": None if peer_label is None else {"label": peer_label, "values": finite(peer)},
           "quality": quality or {}, "target": target, "note": note}
    if dropped:
        out["note"] = (note + "; " if note else "") + f"{sum(dropped)} non-finite value(s) left out"
    return out


# Statuses of a peer that cannot run on this machine: the row says why, and nothing was measured.
ABSENT = ("not installed", "needs ")


def absent(name: str, peer_label: str, why: str, unit: str = "s", higher_is_better: bool = False,
           note: str = "") -> dict:
    """The row of a peer that cannot run here; `why` starts with one of ABSENT ("not installed
    (decord)", "needs a torchcodec built for this torch ...")."""
    assert why.startswith(ABSENT), why
    return row(name, unit, [], [], orchard_label="orchard", peer_label=peer_label,
               higher_is_better=higher_is_better, status=why, note=note)


def missing(name: str, peer_label: str, package: str, unit: str = "s") -> dict:
    """The row of a peer whose package is not installed."""
    return absent(name, peer_label, f"not installed ({package})", unit)


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def stats(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "values": []}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def summarize(r: dict) -> dict:
    """The row with median/min/max of each side, the ratio and whether its target is met."""
    out = dict(r)
    out["orchard"] = {**r["orchard"], **stats(r["orchard"]["values"])}
    if r["peer"] is not None:
        out["peer"] = {**r["peer"], **stats(r["peer"]["values"])}
    o, p = out["orchard"]["median"], (out["peer"] or {}).get("median")
    ratio = None
    if o and p:
        ratio = o / p if r["higher_is_better"] else p / o
    out["ratio"] = ratio
    t = r.get("target")
    out["target_met"] = None
    if t:
        if "met" in t:  # an orchard-only target (a bound, a rate, a peer stopped on the time limit)
            out["target_met"] = bool(t["met"])
        elif ratio is not None and r["status"] == "ok":
            out["target_met"] = ratio >= t["min_ratio"] and t.get("quality_ok", True)
    return out
