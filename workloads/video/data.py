"""Find the videos of a dataset, index each one's frames, and set the bad files aside (counted by kind).

``scan`` reads a dataset in any of its layouts (layouts.py), probes every file a layout names
with the frame index (frame_index.py: read once per file, kept across runs) and sets aside what
is not a usable video, counted by kind (``decoder.SKIP_KINDS``): a JPEG, an audio file or a
broken video is not silently ignored, because a user wants to know their data has holes.

For a run (run.py step 1): ``index_videos`` scans ``video.root``, or the synthetic videos
``prepare_data`` writes to storage once (synthetic_videos.py), and logs what it found;
``segment_dataset`` is the pipeline over chosen segments of those videos; ``untrimmed_videos``
are the videos inference classifies (``video.inference.root``, or synthetic ones).
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .decoder import file_stat
from .frame_index import probe_all, prune_index
from .layouts import classes_problem, read_layout


@dataclass
class VideoIndex:
    """The usable videos of a dataset and the files that were skipped."""

    classes: list[str]
    paths: list[str]
    labels: list[int]
    lengths: list[int]            # decodable frames per video
    splits: list[str]             # "train" or "val"
    skipped: dict[str, str] = field(default_factory=dict)        # path -> reason
    video_bytes: int = 0          # bytes of the usable video files
    pts: list = field(default_factory=list)                      # per video: int64 (T,) frame index
    digests: list[str] = field(default_factory=list)             # per video: sha256 of the file
    skipped_kinds: dict[str, str] = field(default_factory=dict)  # path -> decoder.SKIP_KINDS entry
    layout: str = "folders"       # folders | manifest | ucf101 | hmdb51
    index_reused: int = 0         # frame indices read from the index store (not decoded again)
    index_pruned: int = 0         # index store entries removed after the scan (video.index_max_mb)

    def subset(self, split: str) -> list[int]:
        """Indices of the videos in ``split``."""
        return [i for i, s in enumerate(self.splits) if s == split]

    def skipped_counts(self) -> dict[str, int]:
        """Skipped files per kind (``decoder.SKIP_KINDS``)."""
        return dict(Counter(self.skipped_kinds.values()))


def scan(root: str, val_fraction: float = 0.25, seed: int = 0, min_frames: int = 2,
         decoder: str = "pyav", index_dir: str | None = None, split_files: str | None = None,
         split: int = 1, storage_uri: str | None = None, index_max_mb: float | None = None) -> VideoIndex:
    """Index a dataset (any layout above); split per class, seeded, where the layout gives no split.

    Videos with fewer than ``min_frames`` frames are skipped (a single frame has no
    motion); videos shorter than a segment are usable (the short-video rule covers them).
    ``storage_uri``: the storage folder (``s3://...``) of which ``root`` is this node's copy;
    the index then names every video by its URI, which the probe tasks and decode stages read
    on whatever node they run (``decoder.local_video``). ``index_max_mb``: the bound the index
    store is pruned to after the scan (``prune_index``; None: not pruned).
    """
    from orchard.api import LeavesFolder

    layout = read_layout(root, split_files, split)
    rows = layout.rows
    if storage_uri:
        base = Path(os.path.expanduser(str(root)))
        rows = [(f"{storage_uri.rstrip('/')}/{Path(p).relative_to(base).as_posix()}", c, s) for p, c, s in rows]
    probes = probe_all([r[0] for r in rows], decoder, index_dir)
    pruned = prune_index(index_dir, index_max_mb)
    classes = list(layout.classes)
    index = VideoIndex(classes=classes, paths=[], labels=[], lengths=[], splits=[], layout=layout.kind,
                       index_pruned=pruned, skipped=dict(layout.outside),
                       skipped_kinds={p: LeavesFolder.kind for p in layout.outside})
    split_given: list[str | None] = []
    for (path, label, split_name), (record, reused) in zip(rows, probes):
        index.index_reused += int(reused)
        frames = len(record["pts"])
        if record["kind"] or frames < min_frames:
            index.skipped[path] = record["reason"] or f"only {frames} frames"
            index.skipped_kinds[path] = record["kind"] or "single_frame"
            continue
        index.paths.append(path)
        index.labels.append(classes.index(label))
        index.lengths.append(frames)
        index.pts.append(np.asarray(record["pts"], np.int64))
        index.digests.append(record["digest"])
        index.video_bytes += record.get("size") or file_stat(path)[0]
        split_given.append(split_name)
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


# --------------------------------------------------------------------------- the run's data (run.py step 1)
def index_videos(cfg: dict, ctx, store):
    """Index the videos (frame pts, read once and kept under ``store``'s ``index`` folder: the
    run's cache storage, cache.cache_dir), set non-videos aside (counted by kind) and log what was
    found; returns ``(index, train ids, val ids, skipped files by kind)``."""
    from orchard.api import skipped, ConfigError

    vcfg, seed = cfg["video"], int(cfg["seed"])
    root, storage_uri = prepare_data(cfg, ctx)
    index = scan(root, float(vcfg["val_fraction"]), seed, decoder=vcfg["decoder"], index_dir=store.child("index").uri,
                 split_files=vcfg.get("split_files"), split=int(vcfg.get("split") or 1), storage_uri=storage_uri,
                 index_max_mb=vcfg.get("index_max_mb"))
    problem = classes_problem(index.classes, lambda c: index.classes.index(c) in index.labels, root)
    if problem:
        raise ConfigError("video.root", problem)
    train_ids, val_ids = index.subset("train"), index.subset("val")
    if not train_ids or not val_ids:
        raise ConfigError("video.root", f"training and validation videos; found {len(train_ids)} and "
                          f"{len(val_ids)} in {root}")
    ctx.log_params({"video.root_used": storage_uri or root, "video.classes": ",".join(index.classes), "video.layout": index.layout})
    ctx.log_dict({"files": index.skipped, "kinds": index.skipped_kinds}, "tables/skipped_files.json")
    # the bad-data policy shared by the workloads (orchard/tracking/skipped.py): named, counted by kind, skipped.csv
    set_aside = [skipped.SkippedFile(Path(p).name, index.skipped_kinds.get(p, "unreadable"), r)
                 for p, r in index.skipped.items()]
    skipped_by_kind = {k: v for k, v in skipped.report(ctx, set_aside, "video").items() if k != "data/skipped_files"}
    ctx.log_metrics({"data/videos": len(index.paths), "data/train_videos": len(train_ids),
                     "data/val_videos": len(val_ids), "data/skipped_files": len(index.skipped),
                     "data/index_reused": index.index_reused, "cache/index_pruned": index.index_pruned,
                     "data/video_mb": index.video_bytes / 2**20, **skipped_by_kind})
    if index.skipped:
        ctx.set_tags({"video.skipped_files": "; ".join(f"{Path(p).name}: {r[:60]}" for p, r in index.skipped.items())[:4000]})
    return index, train_ids, val_ids, skipped_by_kind


def prepare_data(cfg: dict, ctx) -> tuple[str, str | None]:
    """The dataset: ``video.root``, or synthetic videos kept in storage; returns (a folder on this
    machine to read the layout from, the storage URI the videos are read from on every node, or
    None when that folder is the one they are read from).

    The synthetic videos live in ``<storage root>/video/data/<settings>`` (``storage.uri``, or
    ``output_dir`` by default: orchard/storage/), keyed by the generator's settings, so later
    runs and other nodes reuse them."""
    from orchard.api import Storage

    from .synthetic_videos import ENCODING

    vcfg = cfg["video"]
    if vcfg.get("root"):
        return vcfg["root"], None
    syn = vcfg["synthetic"]
    difficulty = _difficulty(syn)
    # the encoding's version leads: videos written by an older encoding are not mixed with these
    name = f"synthetic{ENCODING}_c{syn['num_classes']}_v{syn['videos_per_class']}_s{syn['size']}_f{syn['num_frames']}_seed{cfg['seed']}"
    name += "".join(f"_{k}{v:g}" for k, v in difficulty.items() if v)
    store = Storage.root(cfg).child("video", "data", name)
    if store.is_local:
        _generate(cfg, store.local_path)   # idempotent: files already there are kept
        return str(store.local_path), None
    if not store.complete():   # generate here, then publish the folder (marked complete last)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="orchard-video-") as tmp:
            _generate(cfg, Path(tmp))
            store.upload(tmp)
    return str(store.localize()), store.uri


def _generate(cfg: dict, root: Path) -> None:
    """The synthetic training videos (and, with ``bad_files``, the four bad files) under ``root``."""
    from .synthetic_videos import generate_dataset, write_bad_files

    syn = cfg["video"]["synthetic"]
    generate_dataset(root, syn["num_classes"], syn["videos_per_class"], size=syn["size"],
                     num_frames=syn["num_frames"], seed=int(cfg["seed"]), **_difficulty(syn))
    if syn.get("bad_files"):
        first_class = sorted(p for p in root.iterdir() if p.is_dir())[0]
        write_bad_files(first_class, next(first_class.glob("*.mp4")))


def _difficulty(syn: dict) -> dict[str, float]:
    """The generator's difficulty knobs (synthetic_videos.py); absent keys mean off."""
    return {k: float(syn.get(k) or 0.0) for k in ("appearance_cue", "noise", "shake")}


def with_videos(index: VideoIndex, videos: list[dict]) -> VideoIndex:
    """``index`` with ``videos`` (untrimmed ones, their ``pts`` and ``digest`` read by
    ``inference.inference_segments``) after its own, numbered from ``len(index.paths)``: what one
    pipeline over training and inference segments decodes from."""
    import dataclasses

    return dataclasses.replace(index, paths=[*index.paths, *(v["path"] for v in videos)],
                               labels=[*index.labels, *([-1] * len(videos))],
                               lengths=[*index.lengths, *(v["length"] for v in videos)],
                               splits=[*index.splits, *(["untrimmed"] * len(videos))],
                               pts=[*index.pts, *(v["pts"] for v in videos)],
                               digests=[*index.digests, *(v["digest"] for v in videos)])


def segment_dataset(segments, features, index, vcfg, master, cache, block: int | None = None):
    """The Ray Data pipeline (decode once, every feature) over ``segments`` of ``index``'s videos,
    ``block`` segments a block (None: ``pipeline.block_size`` of them all)."""
    from .pipeline import build_dataset

    return build_dataset(segments, features, index.paths, index.lengths, vcfg, master, cache,
                         pts=index.pts, digests=index.digests, block=block)


def untrimmed_videos(cfg: dict, classes: list[str], storage) -> list[dict]:
    """Untrimmed videos to classify: ``video.inference.root`` (class folders) or synthetic ones,
    written to the run's storage (``storage``: its ``untrimmed`` folder) and named there, so the
    decode stages read them on any node."""
    import tempfile

    from .synthetic_videos import MOTION_CLASSES, generate_untrimmed

    vcfg, icfg = cfg["video"], cfg["video"]["inference"]
    if icfg.get("root"):
        found = scan(icfg["root"], val_fraction=0.0, decoder=vcfg["decoder"])
        return [{"path": p, "label": found.classes[lab], "length": n, "pts": pts, "digest": digest}
                for p, lab, n, pts, digest in zip(found.paths, found.labels, found.lengths, found.pts, found.digests)]
    if int(icfg["videos"]) <= 0 or not set(classes) <= set(MOTION_CLASSES):
        return []  # real training data with no untrimmed videos given: nothing to classify
    seed = int(cfg["seed"])
    with tempfile.TemporaryDirectory(prefix="orchard-untrimmed-") as tmp:
        folder = storage.local_path if storage.is_local else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        videos = [generate_untrimmed(folder / f"untrimmed_{i}.mp4", classes[i % len(classes)],
                                     seed=10_000 + seed * 97 + i, size=int(vcfg["synthetic"]["size"]),
                                     background_frames=int(icfg["background_frames"]),
                                     action_frames=int(icfg["action_frames"]), **_difficulty(vcfg["synthetic"]))
                  for i in range(int(icfg["videos"]))]
        if not storage.is_local:
            for video in videos:
                name = Path(video["path"]).name
                storage.write_bytes(name, Path(video["path"]).read_bytes())
                video["path"] = f"{storage.uri}/{name}"
    return videos

