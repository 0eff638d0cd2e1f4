"""Field photos -> region-of-interest tiles -> the tile cache -> a bin-sampled train/test split.

Tiling runs as one Ray task per group of images (the thesis used Apache Spark for it, 3.3.1) and
writes a tile cache every training worker memory-maps:
    tiles/images.npy (N, T, T, 3) uint8, tiles/index.csv, tiles/points.csv, tiles/skipped.csv
A photo that cannot be read is left out and listed in tiles/skipped.csv (``data.PhotoError``).
The photos and their annotations are read by ``data.py``.
"""
from __future__ import annotations

import csv
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np

from orchard.api import partial_name

from .data import (
    DEFAULT_MAX_PIXELS,
    IMAGE_SUFFIXES,
    PhotoError,
    check_remote_tables,
    image_points,
    list_images,
    read_photo,
    read_table,
)

KIND_PRIORITY = ("glare", "roadside", "shadow")  # a tile touching several is tagged by the first


def region_of_interest(shape: tuple[int, ...], tile_size: int, roi: list[int] | None) -> tuple[int, int, int, int]:
    """(x, y, width, height) clipped to the image, sides floored to multiples of tile_size.

    roi None means the whole image: its largest tile-multiple window, centred.
    """
    height, width = shape[:2]
    if roi is None:
        x, y, w, h = 0, 0, width, height
    else:
        x, y, w, h = (int(v) for v in roi)
    w, h = min(w, width - x), min(h, height - y)
    fw, fh = w // tile_size * tile_size, h // tile_size * tile_size
    if fw == 0 or fh == 0:
        raise ValueError(f"region of interest {w}x{h} is smaller than one {tile_size}-pixel tile")
    return x + (w - fw) // 2, y + (h - fh) // 2, fw, fh


def split_into_tiles(rgb: np.ndarray, points: np.ndarray, roi: tuple[int, int, int, int], tile_size: int):
    """Crop roi and cut it into tiles. Returns (tiles (n, T, T, 3), [(row, col, points (k, 2))]).

    A flower belongs to the tile containing its centre; its coordinates become tile-relative.
    """
    x0, y0, w, h = roi
    rows, cols = h // tile_size, w // tile_size
    crop = rgb[y0:y0 + h, x0:x0 + w]
    tiles = crop.reshape(rows, tile_size, cols, tile_size, 3).swapaxes(1, 2).reshape(-1, tile_size, tile_size, 3)
    local = np.asarray(points, dtype=np.float64).reshape(-1, 2) - (x0, y0)
    inside = (local[:, 0] >= 0) & (local[:, 0] < w) & (local[:, 1] >= 0) & (local[:, 1] < h)
    local = local[inside]
    cell = (local // tile_size).astype(int)
    tile_of = cell[:, 1] * cols + cell[:, 0]
    meta = []
    for index in range(rows * cols):
        r, c = divmod(index, cols)
        meta.append((r, c, local[tile_of == index] - (c * tile_size, r * tile_size)))
    return np.ascontiguousarray(tiles), meta


def tile_kind(box: tuple[int, int, int, int], distractors: list[dict[str, str]]) -> str:
    """Scene tag of a tile: the first distractor kind covering >= 10% of it, else 'plain'."""
    x, y, w, h = box
    covered = {}
    for d in distractors:
        dx, dy, dw, dh = (int(d[k]) for k in ("x", "y", "width", "height"))
        ox = max(0, min(x + w, dx + dw) - max(x, dx))
        oy = max(0, min(y + h, dy + dh) - max(y, dy))
        covered[d["kind"]] = max(covered.get(d["kind"], 0.0), ox * oy / (w * h))
    for kind in KIND_PRIORITY:
        if covered.get(kind, 0.0) >= 0.1:
            return kind
    return "plain"


def tile_images(data_dir, names: list[str], tile_size: int, roi: list[int] | None,
                max_pixels: int | None = DEFAULT_MAX_PIXELS):
    """Tile a group of images (the body of one Ray task). Returns (tiles, index rows, point rows,
    skipped): a photo that cannot be read is left out and listed in skipped as
    ``orchard.tracking.skipped.SkippedFile`` (name, kind, reason), never the end of the task.

    ``data_dir`` is a folder or an ``orchard.storage.Storage``: a task on another node reads the
    field through storage (copied once per node), never a path only the driver has."""
    from orchard.api import LeavesFolder, SkippedFile, inside_folder

    root = data_dir.localize() if hasattr(data_dir, "localize") else Path(data_dir)
    points_csv = read_table(root / "points.csv")
    roi_csv = read_table(root / "roi.csv")
    distractor_csv = read_table(root / "distractors.csv")
    all_tiles, index_rows, point_rows, skipped = [], [], [], []
    for name in names:
        try:
            rgb = read_photo(inside_folder(root / "images" / name, root), max_pixels)  # no link out of the folder
            points = image_points(root, name, points_csv.get(name), (root / "points.csv").exists(), max_pixels)
        except (PhotoError, LeavesFolder) as exc:
            skipped.append(SkippedFile(name, exc.kind, str(exc)))
            continue
        window = roi
        if window is None and name in roi_csv:
            r = roi_csv[name][0]
            window = [r["x"], r["y"], r["width"], r["height"]]
        box = region_of_interest(rgb.shape, tile_size, window)
        tiles, meta = split_into_tiles(rgb, points, box, tile_size)
        all_tiles.append(tiles)
        for r, c, tile_points in meta:
            tile = f"{Path(name).stem}_{r}_{c}"  # the thesis's frame<id>_<row>_<col> naming
            tile_box = (box[0] + c * tile_size, box[1] + r * tile_size, tile_size, tile_size)
            kind = tile_kind(tile_box, distractor_csv.get(name, []))
            index_rows.append((tile, name, r, c, len(tile_points), kind))
            point_rows += [(tile, f"{x:.2f}", f"{y:.2f}") for x, y in tile_points]
    tiles = np.concatenate(all_tiles) if all_tiles else np.zeros((0, tile_size, tile_size, 3), np.uint8)
    return tiles, index_rows, point_rows, skipped


def tile_cache(cfg: dict, data, run_storage):
    """The run's tile cache, made once: region-of-interest crop + tiling as parallel Ray tasks
    (3.3.1), reused when present. The synthetic field's tiles are kept beside it, keyed by its
    content, so other runs and nodes share them; a user's field is tiled into the run storage.
    ``data``: the field's ``orchard.storage.Storage``; returns (the storage holding ``tiles/``,
    True if the cache was there)."""
    f = cfg["flower"]
    tile_store = data.child(f"tiles-{f['tile_size']}") if not f["data_dir"] else run_storage
    tiles_hit = tile_store.ready("tiles")
    if not tiles_hit:
        if f["data_dir"] and not data.is_local:  # a local folder's CSVs were checked before Ray started
            check_remote_tables(data)
        max_pixels = f["max_image_pixels"]
        if tile_store.is_local:
            prepare_tiles(data, tile_store.local_path, f["tile_size"], f["roi"], max_pixels=max_pixels)
        else:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="orchard-tiles-") as tmp:
                prepare_tiles(data, tmp, f["tile_size"], f["roi"], max_pixels=max_pixels)
                tile_store.upload(Path(tmp) / "tiles", "tiles")
    return tile_store, tiles_hit


def prepare_tiles(data_dir: str | Path, out_dir: str | Path, tile_size: int, roi: list[int] | None,
                  images_per_task: int = 4, parallel: bool = True,
                  max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Path:
    """Tile every image of data_dir, one Ray task per `images_per_task` images (parallel=False:
    in this process, for tools that run without Ray); write the cache under out_dir/tiles, with
    the photos that could not be read in tiles/skipped.csv (``TileSet.skipped``)."""
    from orchard.api import skipped as skip_log

    if hasattr(data_dir, "localize"):  # an orchard.storage.Storage: list it there, tasks fetch it
        names = [n for n in data_dir.list("images") if Path(n).suffix.lower() in IMAGE_SUFFIXES]
    else:
        names = list_images(data_dir)
    if not names:
        raise FileNotFoundError(f"no images under {data_dir}/images")
    groups = [names[i:i + images_per_task] for i in range(0, len(names), images_per_task)]
    cache = Path(out_dir) / "tiles"
    partial = cache.with_name(partial_name("tiles"))
    partial.mkdir(parents=True, exist_ok=True)
    index_rows, point_rows, skipped = [], [], []
    tiles_held = 0
    try:
        # the tiles stream to disk one group at a time, in order: the driver never holds them all
        with open(partial / "images.raw", "wb") as raw:
            for tiles, index, points, left_out in _tiled_groups(data_dir, groups, tile_size, roi, max_pixels, parallel):
                raw.write(np.ascontiguousarray(tiles, np.uint8).tobytes())
                tiles_held += len(tiles)
                index_rows += index
                point_rows += points
                skipped += left_out
        _raw_to_npy(partial / "images.raw", partial / "images.npy", (tiles_held, tile_size, tile_size, 3))
        for name, header, rows in (("index.csv", ("tile", "image", "row", "col", "count", "kind"), index_rows),
                                   ("points.csv", ("tile", "x", "y"), point_rows)):
            with open(partial / name, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(header)
                writer.writerows(rows)
        skip_log.write_csv(skipped, partial / skip_log.SKIPPED_CSV)
    except BaseException:  # a failed task, a full disk: no half cache folder stays behind
        shutil.rmtree(partial, ignore_errors=True)
        raise
    try:
        partial.rename(cache)  # atomic: runs sharing a synthetic field never see half a cache
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)  # another run wrote it first
    return cache


def _tiled_groups(data_dir, groups: list[list[str]], tile_size: int, roi, max_pixels, parallel: bool):
    """``tile_images`` of each group, in order, one at a time: Ray tasks run them in parallel, and
    the driver fetches one group's tiles, lets the caller write them, then drops them."""
    if not parallel:
        for g in groups:
            yield tile_images(data_dir, g, tile_size, roi, max_pixels)
        return
    import ray

    task = ray.remote(num_cpus=1)(tile_images)
    source = data_dir if hasattr(data_dir, "localize") else str(data_dir)
    refs = [task.remote(source, g, tile_size, roi, max_pixels) for g in groups]
    while refs:
        yield ray.get(refs.pop(0))   # popped: the object store lets the group go once it is written


def _raw_to_npy(raw: Path, npy: Path, shape: tuple[int, ...]) -> None:
    """The uint8 bytes of ``raw`` as the ``.npy`` array of ``shape``: read straight into a memory
    map of the new file (the page cache, not this process's heap), then ``raw`` removed."""
    if shape[0] == 0:
        np.save(npy, np.zeros(shape, np.uint8))
    else:
        out = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=shape)
        view, pos = memoryview(out.reshape(-1)), 0
        with open(raw, "rb", buffering=0) as f:
            while pos < len(view) and (got := f.readinto(view[pos:pos + (1 << 24)])):
                pos += got
        view.release()
        out.flush()
        del out
    raw.unlink()


class TileSet:
    """The tile cache: images (memory-mapped), counts, scene kinds and per-tile points."""

    def __init__(self, cache: str | Path):
        cache = Path(cache)
        self.images = np.load(cache / "images.npy", mmap_mode="r")
        with open(cache / "index.csv", newline="") as f:
            index = list(csv.DictReader(f))
        self.names = [r["tile"] for r in index]
        self.counts = np.array([int(r["count"]) for r in index], dtype=np.int64)
        self.kinds = [r["kind"] for r in index]
        from orchard.api import skipped as skip_log

        self.skipped = skip_log.read_csv(cache / skip_log.SKIPPED_CSV)  # photos left out ([]: a cache before it)
        self.photos = len({r["image"] for r in index})                  # photos that gave tiles
        grouped = read_table_by(cache / "points.csv", "tile")
        self.points = [np.array([[float(p["x"]), float(p["y"])] for p in grouped.get(n, [])]).reshape(-1, 2)
                       for n in self.names]

    def __len__(self) -> int:
        return len(self.names)


def read_table_by(path: Path, key: str) -> dict[str, list[dict[str, str]]]:
    grouped: dict[str, list[dict[str, str]]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            grouped[row[key]].append(row)
    return grouped


def assign_bins(counts: np.ndarray, bins: list[list[int | None]]) -> np.ndarray:
    """Bin index of each count (-1 where no bin holds it); bins are inclusive [low, high|None]."""
    counts = np.asarray(counts)
    out = np.full(counts.shape, -1, dtype=np.int64)
    for i, (low, high) in enumerate(bins):
        inside = (counts >= low) & (counts <= (np.inf if high is None else high))
        out[(out == -1) & inside] = i
    return out


def bin_label(bin_range: list[int | None]) -> str:
    """'0', '3-4', '8+' for a bin [low, high]."""
    low, high = bin_range
    if high is None:
        return f"{low}+"
    return str(low) if low == high else f"{low}-{high}"


def bin_sample(counts: np.ndarray, bins: list[list[int | None]], train_fraction: float, seed: int):
    """Bin sampling of 4.1.1: as many tiles from every bin as the smallest non-empty bin holds.

    The sampled set is shuffled and its first train_fraction become the training set, the rest
    the test set (the thesis's 70/30). Empty bins are skipped (they would make every bin empty).
    Returns (train indices, test indices, per-bin sizes before sampling).
    """
    rng = np.random.default_rng(seed)
    which = assign_bins(counts, bins)
    sizes = [int((which == b).sum()) for b in range(len(bins))]
    nonempty = [s for s in sizes if s > 0]
    if not nonempty:
        raise ValueError("no tile falls into any count bin")
    per_bin = min(nonempty)
    chosen = np.concatenate([rng.choice(np.nonzero(which == b)[0], per_bin, replace=False)
                             for b in range(len(bins)) if sizes[b] > 0])
    rng.shuffle(chosen)
    cut = int(round(train_fraction * len(chosen)))
    return np.sort(chosen[:cut]), np.sort(chosen[cut:]), sizes
