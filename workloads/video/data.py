"""Find the videos of a dataset, index each one's frames, and set the bad files aside (counted by kind).

Layouts, read as they are:

- a folder with one sub-folder per class (UCF101's ``UCF-101/<class>/*.avi``);
- a manifest CSV with columns ``path,label`` and optionally ``split`` (train|val); relative
  paths are relative to the CSV;
- UCF101 split files (``classInd.txt``, ``trainlist0N.txt``, ``testlist0N.txt``) or HMDB51's
  (``<class>_test_splitN.txt``, tags 1 = train, 2 = test, 0 = unused), in ``video.split_files``
  or found next to the videos; the test list is the validation set.

Every regular, non-hidden file a layout names is a candidate: a JPEG, an audio file or a
broken video is not silently ignored but probed, rejected and counted by kind
(``decoder.SKIP_KINDS``), because a user wants to know their data has holes.

The frame index of a video (the pts of every frame) and its content digest are read once
and kept under ``<cache_dir>/index``: a second run over the same files decodes nothing to
scan them.  The store is bounded (``video.index_max_mb``): after each scan the least recently
used entries go (a read refreshes an entry; an edited file's old entry is never read again).

For a run (run.py step 1): ``index_videos`` scans ``video.root``, or the synthetic videos
``prepare_data`` writes to storage once (synthetic_videos.py), and logs what it found;
``segment_dataset`` is the pipeline over chosen segments of those videos; ``untrimmed_videos``
are the videos inference classifies (``video.inference.root``, or synthetic ones).
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .decoder import BadVideo, build_decoder, file_stat, local_video, looks_like_video


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


@dataclass
class Layout:
    rows: list[tuple[str, str, str | None]]   # (path, class name, split or None)
    classes: list[str]                        # every class the layout declares
    kind: str
    outside: dict[str, str] = field(default_factory=dict)  # path -> why: links out of the folder, never read


# --------------------------------------------------------------------------- layouts
def _scan_folder(root: Path) -> Layout:
    rows, classes = [], []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        classes.append(class_dir.name)
        for f in sorted(class_dir.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                rows.append((str(f), class_dir.name, None))
    return Layout(rows, classes, "folders")


_MANIFEST = "rows path,label[,split]: a video file, its class name, and train, val or test"


def _scan_manifest(csv_path: Path) -> Layout:
    """The rows of a manifest CSV, checked whole: a row without a path or a label, or with an
    unknown split, is a LayoutError naming the file and its line (the config check: exit 2)."""
    rows = []
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in reader.fieldnames or ()]
            if not {"path", "label"} <= set(header):
                raise LayoutError(f"{csv_path}: a manifest needs the columns path,label[,split]; "
                                  f"found {','.join(header) or 'no header'}")
            reader.fieldnames = header
            for rec in reader:
                path, label = (rec.get("path") or "").strip(), (rec.get("label") or "").strip()
                missing = [k for k, v in (("path", path), ("label", label)) if not v]
                if missing:
                    raise LayoutError(f"{csv_path} line {reader.line_num}: no {' and no '.join(missing)} "
                                      f"(expected {_MANIFEST})")
                split = (rec.get("split") or "").strip().lower() or None
                if split not in (None, "train", "val", "test"):
                    raise LayoutError(f"{csv_path} line {reader.line_num}: split {split!r} (expected {_MANIFEST})")
                p = Path(path)
                p = p if p.is_absolute() else csv_path.parent / p
                rows.append((str(p), label, {"test": "val"}.get(split, split)))
    except UnicodeDecodeError:
        raise LayoutError(f"{csv_path}: not a CSV table in UTF-8 text (expected {_MANIFEST})") from None
    except csv.Error as exc:
        raise LayoutError(f"{csv_path}: not a CSV table ({exc}; expected {_MANIFEST})") from None
    return Layout(rows, sorted({r[1] for r in rows}), "manifest")


class LayoutError(ValueError):
    """The dataset's layout cannot be read (the config check turns it into one line)."""


def find_split_files(root: Path, split_files: str | None, split: int) -> tuple[str, Path] | None:
    """``("ucf101" | "hmdb51", folder)`` of the split files, or None for a plain layout."""
    candidates = [Path(split_files)] if split_files else \
        [root, root / "ucfTrainTestlist", root / "testTrainMulti_7030_splits", root.parent / "ucfTrainTestlist"]
    for folder in candidates:
        if (folder / "classInd.txt").is_file():
            return "ucf101", folder
        if folder.is_dir() and any(folder.glob(f"*_test_split{split}.txt")):
            return "hmdb51", folder
    if split_files:
        raise LayoutError(f"{split_files}: neither classInd.txt (UCF101) nor *_test_split{split}.txt (HMDB51)")
    return None


def _video_path(root: Path, rel: str) -> str:
    for base in (root, root / "UCF-101", root / "hmdb51", root / "videos"):
        if (base / rel).exists():
            return str(base / rel)
    return str(root / rel)


def _scan_ucf101(root: Path, folder: Path, split: int) -> Layout:
    classes = {}
    for line in (folder / "classInd.txt").read_text().splitlines():
        if line.strip():
            number, name = line.split(maxsplit=1)
            classes[int(number)] = name.strip()
    rows = []
    for list_name, split_name in ((f"trainlist{split:02d}.txt", "train"), (f"testlist{split:02d}.txt", "val")):
        list_file = folder / list_name
        if not list_file.is_file():
            raise LayoutError(f"{folder}: no {list_name} next to classInd.txt")
        for line in list_file.read_text().splitlines():
            parts = line.split()
            if not parts:
                continue
            rel = parts[0].replace("\\", "/")
            name = classes[int(parts[1])] if len(parts) > 1 else rel.split("/")[0]
            rows.append((_video_path(root, rel), name, split_name))
    return Layout(rows, [classes[k] for k in sorted(classes)], "ucf101")


def _scan_hmdb51(root: Path, folder: Path, split: int) -> Layout:
    rows, classes = [], []
    for list_file in sorted(folder.glob(f"*_test_split{split}.txt")):
        name = re.sub(rf"_test_split{split}\.txt$", "", list_file.name)
        classes.append(name)
        for line in list_file.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1] in ("1", "2"):
                rows.append((_video_path(root, f"{name}/{parts[0]}"), name, "train" if parts[1] == "1" else "val"))
    return Layout(rows, classes, "hmdb51")


def read_layout(root: str, split_files: str | None = None, split: int = 1) -> Layout:
    """The candidate files of a dataset and the classes its layout declares (no decoding)."""
    root_path = Path(os.path.expanduser(str(root)))
    if root_path.suffix.lower() == ".csv":
        return _scan_manifest(root_path)
    found = find_split_files(root_path, split_files, split)
    if found is None:
        layout = _scan_folder(root_path)
    else:
        kind, folder = found
        layout = (_scan_ucf101 if kind == "ucf101" else _scan_hmdb51)(root_path, folder, split)
    return _no_links_out(layout, root_path)


def _no_links_out(layout: Layout, root: Path) -> Layout:
    """A folder's rows without the files that link out of it (a manifest names its paths; a
    folder's links out are never opened), those set aside in ``outside`` to be counted."""
    from orchard.skipped import LeavesFolder, inside_folder

    for path, _, _ in layout.rows:
        try:
            if Path(path).exists():
                inside_folder(path, root)
        except LeavesFolder as exc:
            layout.outside[path] = str(exc)
    layout.rows = [r for r in layout.rows if r[0] not in layout.outside]
    return layout


def check_classes(root: str, split_files: str | None = None, split: int = 1) -> str:
    """``""`` when the dataset has two or more classes, each with a plausible video; else why not.

    Header checks only (``decoder.looks_like_video``, one file per class at best), so that
    the config check can run it before Ray starts; ``scan`` decodes everything later.
    """
    try:
        layout = read_layout(root, split_files, split)
    except (LayoutError, OSError, KeyError, ValueError) as exc:
        return f"a readable dataset layout; {exc}"
    by_class = defaultdict(list)
    for path, name, _ in layout.rows:
        by_class[name].append(path)
    return classes_problem(layout.classes, lambda c: any(looks_like_video(p) == "" for p in by_class[c]), root)


def classes_problem(classes: list[str], usable, root: str) -> str:
    """The one-line complaint about a dataset's classes, or ``""``."""
    if len(classes) < 2:
        found = f"1 class ({classes[0]})" if classes else "no class"
        return f"at least 2 classes with usable videos to classify; found {found} in {root}"
    empty = [c for c in classes if not usable(c)]
    if empty:
        return (f"a usable video in every class; none in {len(empty)} class(es): {', '.join(empty[:5])}"
                f"{' ...' if len(empty) > 5 else ''} ({root})")
    return ""


# --------------------------------------------------------------------------- the frame index store
def file_digest(path: str, chunk: int = 1 << 20) -> str:
    """sha256 of the file's bytes: the content address of its cache entries."""
    h = hashlib.sha256()
    with open(local_video(path), "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class IndexStore:
    """Per-file probe results (``{kind, reason, digest, pts, size}``), keyed by path, size, mtime,
    in storage (orchard/storage.py: a folder, or a bucket shared by the nodes and runs).

    One small JSON per file, written whole: concurrent runs may both write one, never half of
    one. An edited file (new size or mtime) misses and is probed again. Paths are local paths or
    storage URIs (``s3://...``); the store itself is a local folder or a URI.
    """

    def __init__(self, directory: str | os.PathLike | None):
        from orchard.storage import Storage

        self.storage = Storage(directory) if directory else None

    def _name(self, path: str) -> str | None:
        from orchard.storage import is_uri

        stat = file_stat(path) if self.storage is not None else None
        if stat is None:
            return None
        where = path if is_uri(path) else os.path.abspath(path)
        key = hashlib.sha1(f"{where}|{stat[0]}|{stat[1]}".encode()).hexdigest()
        return f"{key[:2]}/{key}.json"

    def get(self, path: str) -> dict | None:
        name = self._name(path)
        if name is None:
            return None
        try:
            record = json.loads(self.storage.read_bytes(name))
        except (OSError, ValueError):   # absent (pyarrow: FileNotFoundError), or unreadable: probe again
            return None
        if self.storage.is_local:   # used now: last in line when the store is pruned (prune_index)
            with contextlib.suppress(OSError):
                os.utime(self.storage.local_path / name)
        return record

    def put(self, path: str, record: dict) -> None:
        name = self._name(path)
        if name is not None:
            self.storage.write_text(name, json.dumps(record))


def prune_index(index_dir: str | None, max_mb: float | None) -> int:
    """Hold the frame-index store under ``max_mb`` MiB: its least recently used entries are
    removed (``cache.evict_lru``). Returns how many went. A store in remote storage
    (``s3://...``) has no mtime to refresh: bound it with the store's own expiry rule."""
    from orchard.storage import Storage

    from .cache import evict_lru

    if not index_dir or not max_mb:
        return 0
    store = Storage(index_dir)
    if not store.is_local or not store.local_path.is_dir():
        return 0
    return evict_lru(store.local_path, int(float(max_mb) * 2**20), pattern="*/*.json")[1]


def probe_file(path: str, decoder, store: IndexStore) -> tuple[dict, bool]:
    """``({kind, reason, digest, pts, size}, reused)`` for one file (a local path or a storage
    URI, copied to this node to decode it); kind ``""`` = a usable video."""
    cached = store.get(path)
    if cached is not None:
        return cached, True
    record = {"kind": "", "reason": "", "digest": "", "pts": [], "size": 0}
    try:
        stat = file_stat(path)
        if stat is None:
            raise BadVideo("missing file", "missing")
        record["size"] = stat[0]
        if stat[0] == 0:
            raise BadVideo("zero-byte file", "empty")
        record["pts"] = decoder.index(path).tolist()
        record["digest"] = file_digest(path)
    except BadVideo as exc:
        record.update(kind=exc.kind, reason=str(exc), pts=[])
    if record["kind"] != "missing":
        store.put(path, record)
    return record, False


def _probe_chunk(paths: list[str], decoder: str, store_dir: str | None) -> list[tuple[dict, bool]]:
    dec, store = build_decoder(decoder), IndexStore(store_dir)
    return [probe_file(p, dec, store) for p in paths]


def probe_all(paths: list[str], decoder: str = "pyav", store_dir: str | None = None,
              chunk: int = 16) -> list[tuple[dict, bool]]:
    """Probe every file; in parallel Ray tasks when Ray is up (one chunk per task)."""
    chunks = [paths[i:i + chunk] for i in range(0, len(paths), chunk)]
    try:
        import ray
        parallel = ray.is_initialized() and len(chunks) > 1
    except ImportError:
        parallel = False
    if parallel:
        task = ray.remote(num_cpus=1)(_probe_chunk)
        results = ray.get([task.remote(c, decoder, store_dir) for c in chunks])
    else:
        results = [_probe_chunk(c, decoder, store_dir) for c in chunks]
    return [r for res in results for r in res]


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
    from orchard.skipped import LeavesFolder

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
    from orchard import skipped
    from orchard.errors import ConfigError

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
    # the bad-data policy shared by the workloads (orchard/skipped.py): named, counted by kind, skipped.csv
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
    ``output_dir`` by default: orchard/storage.py), keyed by the generator's settings, so later
    runs and other nodes reuse them."""
    from orchard.storage import Storage

    vcfg = cfg["video"]
    if vcfg.get("root"):
        return vcfg["root"], None
    syn = vcfg["synthetic"]
    difficulty = _difficulty(syn)
    name = f"synthetic_c{syn['num_classes']}_v{syn['videos_per_class']}_s{syn['size']}_f{syn['num_frames']}_seed{cfg['seed']}"
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


def segment_dataset(segments, features, index, vcfg, master, cache):
    """The Ray Data pipeline (decode once, every feature) over ``segments`` of ``index``'s videos."""
    from .pipeline import build_dataset

    return build_dataset(segments, features, index.paths, index.lengths, vcfg, master, cache,
                         pts=index.pts, digests=index.digests)


def untrimmed_videos(cfg: dict, classes: list[str], storage) -> list[dict]:
    """Untrimmed videos to classify: ``video.inference.root`` (class folders) or synthetic ones,
    written to the run's storage (``storage``: its ``untrimmed`` folder) and named there, so the
    decode stages read them on any node."""
    import tempfile

    from .synthetic_videos import MOTION_CLASSES, generate_untrimmed

    vcfg, icfg = cfg["video"], cfg["video"]["inference"]
    if icfg.get("root"):
        found = scan(icfg["root"], val_fraction=0.0, decoder=vcfg["decoder"])
        return [{"path": p, "label": found.classes[lab], "length": n, "pts": pts}
                for p, lab, n, pts in zip(found.paths, found.labels, found.lengths, found.pts)]
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

