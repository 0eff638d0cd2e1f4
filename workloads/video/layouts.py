"""The layouts of a video dataset, read as they are:

- a folder with one sub-folder per class (UCF101's ``UCF-101/<class>/*.avi``);
- a manifest CSV with columns ``path,label`` and optionally ``split`` (train|val); relative
  paths are relative to the CSV;
- UCF101 split files (``classInd.txt``, ``trainlist0N.txt``, ``testlist0N.txt``) or HMDB51's
  (``<class>_test_splitN.txt``, tags 1 = train, 2 = test, 0 = unused), in ``video.split_files``
  or found next to the videos; the test list is the validation set.

Every regular, non-hidden file a layout names is a candidate (data.py probes and counts the
bad ones); a link that leaves the dataset's folder is set aside."""
from __future__ import annotations

import csv
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .decoder import looks_like_video


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
    from orchard.api import LeavesFolder, inside_folder

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
