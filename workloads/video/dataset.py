"""Find the videos of a dataset, probe each one, and set the bad ones aside (counted, named).

Two layouts: a folder with one sub-folder per class (UCF101), or a manifest CSV
with columns ``path,label`` and optionally ``split`` (train|val); relative paths
are relative to the CSV. Every regular, non-hidden file in a class folder is a
candidate: a text file or a broken video is not silently ignored but probed,
rejected and reported, because a user wants to know their data has holes.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .decoder import BadVideo, build_decoder


@dataclass
class VideoIndex:
    """The usable videos of a dataset and the files that were skipped."""

    classes: list[str]
    paths: list[str]
    labels: list[int]
    lengths: list[int]            # decodable frames per video
    splits: list[str]             # "train" or "val"
    skipped: dict[str, str] = field(default_factory=dict)   # path -> reason
    video_bytes: int = 0          # bytes of the usable video files

    def subset(self, split: str) -> list[int]:
        """Indices of the videos in ``split``."""
        return [i for i, s in enumerate(self.splits) if s == split]

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d: dict) -> "VideoIndex":
        return VideoIndex(**d)


def _scan_folder(root: Path) -> list[tuple[str, str, str | None]]:
    rows = []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for f in sorted(class_dir.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                rows.append((str(f), class_dir.name, None))
    return rows


def _scan_manifest(csv_path: Path) -> list[tuple[str, str, str | None]]:
    rows = []
    with open(csv_path, newline="") as fh:
        for rec in csv.DictReader(fh):
            p = Path(rec["path"])
            p = p if p.is_absolute() else csv_path.parent / p
            rows.append((str(p), rec["label"], rec.get("split") or None))
    return rows


def _probe_chunk(paths: list[str], decoder: str) -> list[tuple[int, str]]:
    """(frames, "") for a good video, (0, reason) for a bad file."""
    dec = build_decoder(decoder)
    out = []
    for p in paths:
        try:
            if not os.path.isfile(p):
                raise BadVideo("missing file")
            if os.path.getsize(p) == 0:
                raise BadVideo("zero-byte file")
            out.append((dec.probe(p), ""))
        except BadVideo as exc:
            out.append((0, str(exc)))
    return out


def probe_all(paths: list[str], decoder: str = "pyav", chunk: int = 16) -> list[tuple[int, str]]:
    """Probe every file; in parallel Ray tasks when Ray is up (one chunk per task)."""
    chunks = [paths[i:i + chunk] for i in range(0, len(paths), chunk)]
    try:
        import ray
        parallel = ray.is_initialized() and len(chunks) > 1
    except ImportError:
        parallel = False
    if parallel:
        task = ray.remote(num_cpus=1)(_probe_chunk)
        results = ray.get([task.remote(c, decoder) for c in chunks])
    else:
        results = [_probe_chunk(c, decoder) for c in chunks]
    return [r for res in results for r in res]


def scan(root: str, val_fraction: float = 0.25, seed: int = 0, min_frames: int = 1,
         decoder: str = "pyav") -> VideoIndex:
    """Index a class-folder tree or a manifest CSV; split per class, seeded, when no split is given.

    Videos with fewer than ``min_frames`` frames are usable (the short-video rule
    covers them) unless they have none.
    """
    root_path = Path(root)
    rows = _scan_manifest(root_path) if root_path.suffix.lower() == ".csv" else _scan_folder(root_path)
    probes = probe_all([r[0] for r in rows], decoder)
    classes = sorted({r[1] for r in rows})
    index = VideoIndex(classes=classes, paths=[], labels=[], lengths=[], splits=[])
    split_given: list[str | None] = []
    for (path, label, split), (frames, reason) in zip(rows, probes):
        if reason or frames < min_frames:
            index.skipped[path] = reason or f"only {frames} frames"
            continue
        index.paths.append(path)
        index.labels.append(classes.index(label))
        index.lengths.append(frames)
        index.video_bytes += os.path.getsize(path)
        split_given.append(split)
    # Seeded per-class split so every class is in both sets (at least one val
    # video where a class has two or more).
    rng = np.random.default_rng(seed)
    index.splits = ["train"] * len(index.paths)
    for c in range(len(classes)):
        members = [i for i, lab in enumerate(index.labels) if lab == c and split_given[i] is None]
        rng.shuffle(members)
        n_val = int(round(len(members) * val_fraction))
        n_val = max(n_val, 1) if len(members) >= 2 and val_fraction > 0 else n_val
        for i in members[:n_val]:
            index.splits[i] = "val"
    for i, s in enumerate(split_given):
        if s is not None:
            index.splits[i] = s
    return index
