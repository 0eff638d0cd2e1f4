"""Field images + annotations -> region-of-interest tiles -> bin-sampled train/test split.

On-disk input (the real format; `synthetic_field.py` writes the same):
    images/<name>.(png|jpg)        field photographs
    points.csv                     image,x,y flower centres in image pixels, and/or
    annotated/<name>.png           copies with pure-red crosses on each flower (3.3.2)
    roi.csv (optional)             image,x,y,width,height region of interest (3.3.1)
    distractors.csv (optional)     image,kind,x,y,width,height (tags tiles for per-scene metrics)
Tiling runs as one Ray task per group of images (the thesis used Apache Spark for it, 3.3.1) and
writes a tile cache every training worker memory-maps:
    tiles/images.npy (N, T, T, 3) uint8, tiles/index.csv, tiles/points.csv, tiles/skipped.csv

Bad data (docs/flower.md): the CSVs are checked whole before Ray starts and a bad row is one
line naming the file, the line and what was expected (``TableError``, exit 2); a photo that
cannot be read (truncated, not an image, over ``flower.max_image_pixels``) is skipped and
counted by kind (``PhotoError``, ``orchard.skipped``), never the end of the run by itself.
"""
from __future__ import annotations

import contextlib
import csv
import math
import shutil
from collections import defaultdict
from pathlib import Path

import cv2
import numpy as np

from orchard.storage import partial_name

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
KIND_PRIORITY = ("glare", "roadside", "shadow")  # a tile touching several is tagged by the first
DEFAULT_MAX_PIXELS = 178_956_970  # PIL's own refusal (2 x Image.MAX_IMAGE_PIXELS); flower.max_image_pixels


def read_rgb(path: str | Path) -> np.ndarray:
    """An image file as RGB uint8 (H, W, 3)."""
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise FileNotFoundError(f"cannot read image {path}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


# --------------------------------------------------------------------------- photos that cannot be read
class PhotoError(ValueError):
    """A photo that cannot be used; ``kind`` is the key of ``data/skipped/<kind>``: missing, empty,
    unreadable, not_image, truncated, corrupt, too_large, no_annotation."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


@contextlib.contextmanager
def _own_pixel_limit():
    """PIL's decompression-bomb check off: ``photo_size`` applies ``flower.max_image_pixels`` from
    the header instead, before a pixel is decoded (a tiling task or the config check: one thread)."""
    from PIL import Image

    before, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = before


def _open_photo(path: Path, max_pixels: int | None):
    """The opened (not yet decoded) PIL image and its (width, height) as shown, EXIF rotation
    applied; PhotoError for a file that is absent, empty, not an image or over ``max_pixels``."""
    from PIL import Image, UnidentifiedImageError

    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise PhotoError("missing", "no such file (a dangling link?)") from None
    except OSError as exc:
        raise PhotoError("unreadable", _one_line(exc)) from None
    if not path.is_file():
        raise PhotoError("unreadable", "not a regular file")
    if size == 0:
        raise PhotoError("empty", "zero-byte file")
    try:
        image = Image.open(path)
    except UnidentifiedImageError:
        raise PhotoError("not_image", "not an image PIL can read (PNG, JPEG, TIFF, BMP)") from None
    except PermissionError as exc:
        raise PhotoError("unreadable", _one_line(exc)) from None
    except Exception as exc:  # a header PIL recognises but cannot parse
        raise PhotoError("corrupt", _one_line(exc)) from None
    width, height = image.size
    try:
        if image.getexif().get(0x0112) in (5, 6, 7, 8):  # EXIF orientation: a quarter turn
            width, height = height, width
    except Exception:  # an unreadable EXIF block: the photo as stored
        pass
    if max_pixels is not None and width * height > max_pixels:
        image.close()
        raise PhotoError("too_large", f"{width}x{height} = {width * height / 1e6:.0f} MP, over flower.max_image_pixels="
                         f"{max_pixels} (each photo is held whole while it is tiled: ~{width * height * 3 / 2**30:.1f} "
                         "GiB; raise the key, null for no limit, or cut the photo)")
    return image, (width, height)


def photo_size(path: str | Path, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """(width, height) of a photo from its header (EXIF rotation applied); PhotoError as
    ``read_photo`` would raise it short of decoding the pixels."""
    with _own_pixel_limit():
        image, size = _open_photo(Path(path), max_pixels)
        image.close()
    return size


def read_photo(path: str | Path, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A field photo as RGB uint8 (H, W, 3), decoded whole and strictly: a truncated file is a
    PhotoError (cv2 would return the part it could read, grey below). EXIF rotation is applied,
    as ``cv2.imread`` does; 16-bit samples keep their high byte, as it does."""
    from PIL import ImageOps

    with _own_pixel_limit():
        image, _ = _open_photo(Path(path), max_pixels)
        try:
            with image:
                image.load()
                ImageOps.exif_transpose(image, in_place=True)
                if image.mode in ("I;16", "I;16B", "I;16L", "I"):
                    grey = (np.asarray(image, dtype=np.int64) >> 8).clip(0, 255).astype(np.uint8)
                    return np.ascontiguousarray(np.repeat(grey[..., None], 3, axis=-1))
                return np.ascontiguousarray(np.asarray(image.convert("RGB")))
        except OSError as exc:
            kind = "truncated" if "truncated" in str(exc).lower() else "corrupt"
            raise PhotoError(kind, _one_line(exc)) from None
        except (ValueError, SyntaxError, EOFError) as exc:  # what PIL's decoders raise on bad data
            raise PhotoError("corrupt", _one_line(exc)) from None


def _one_line(exc: BaseException) -> str:
    from orchard.skipped import one_line

    return one_line(exc)


def red_cross_points(rgb: np.ndarray, arm: int = 2) -> np.ndarray:
    """Centres (N, 2) x,y of pure-red (255, 0, 0) crosses of the given arm length (3.3.2).

    Eroding the red mask with a plus-shaped kernel keeps only pixels whose whole cross is red:
    one pixel per cross, even where two crosses touch. Crosses cut by the image border
    (arms missing) are found from the remaining red blob's centroid instead.
    """
    red = np.all(rgb == (255, 0, 0), axis=-1).astype(np.uint8)
    size = 2 * arm + 1
    kernel = np.zeros((size, size), np.uint8)
    kernel[arm, :] = 1
    kernel[:, arm] = 1
    centres = cv2.erode(red, kernel, borderType=cv2.BORDER_CONSTANT, borderValue=0)
    n, _, _, centroids = cv2.connectedComponentsWithStats(centres, connectivity=8)
    points = [centroids[1:]]
    # Blobs with no surviving centre: crosses clipped by the border.
    n_blobs, labels = cv2.connectedComponents(red, connectivity=8)
    hit = set(np.unique(labels[centres > 0]).tolist())
    for label in range(1, n_blobs):
        if label not in hit:
            ys, xs = np.nonzero(labels == label)
            touches_border = xs.min() == 0 or ys.min() == 0 or xs.max() == rgb.shape[1] - 1 \
                or ys.max() == rgb.shape[0] - 1
            if touches_border:
                points.append(np.array([[xs.mean(), ys.mean()]]))
    return np.concatenate(points).astype(np.float64).reshape(-1, 2)


def list_images(data_dir: str | Path) -> list[str]:
    """File names under data_dir/images, sorted."""
    folder = Path(data_dir) / "images"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist (expected images/ with field photographs)")
    return sorted(p.name for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


# --------------------------------------------------------------------------- the user's CSVs
def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _whole(text: str) -> int:
    value = _number(text)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


# file -> (column parsers after `image`, what a row is): the format at the top of this module
TABLES = {
    "points.csv": ({"x": (_number, "a number"), "y": (_number, "a number")},
                   "image,x,y: an image name and a flower centre in its pixels"),
    "roi.csv": ({k: (_whole, "a whole number") for k in ("x", "y", "width", "height")},
                "image,x,y,width,height: an image name and its region of interest in pixels"),
    "distractors.csv": ({"kind": (str, "a scene kind"), **{k: (_whole, "a whole number") for k in ("x", "y", "width", "height")}},
                        "image,kind,x,y,width,height: an image name, a scene kind and its box in pixels"),
}


class TableError(ValueError):
    """A CSV of the data folder that does not hold what its format says: the message names the
    file, the line and what was expected (the config check makes it one line, exit 2)."""


def read_table(path: Path) -> dict[str, list[dict]]:
    """Rows of a CSV with an `image` column, grouped by image name ({} when absent). The files of
    ``TABLES`` are checked whole and their numbers parsed (TableError on the first bad row)."""
    grouped: dict[str, list[dict]] = defaultdict(list)
    if not path.exists():
        return grouped
    columns, expected = TABLES.get(path.name, ({}, "a CSV table with an image column"))
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in reader.fieldnames or ()]
            missing = [c for c in ("image", *columns) if c not in header]
            if missing:
                raise TableError(f"{path} line 1: the header {','.join(header) or '(empty)'!r} lacks "
                                 f"{','.join(missing)} (expected {expected})")
            reader.fieldnames = header
            for row in reader:
                grouped[_table_row(row, columns, path, reader.line_num, expected)["image"]].append(row)
    except UnicodeDecodeError:
        raise TableError(f"{path}: not a CSV table in UTF-8 text (expected {expected})") from None
    except csv.Error as exc:
        raise TableError(f"{path}: not a CSV table ({exc}; expected {expected})") from None
    return grouped


def _table_row(row: dict, columns: dict, path: Path, line: int, expected: str) -> dict:
    """One row with its columns parsed in place; TableError naming the line otherwise."""
    if not (row.get("image") or "").strip():
        raise TableError(f"{path} line {line}: no image name (expected {expected})")
    row["image"] = row["image"].strip()
    for key, (parse, what) in columns.items():
        text = row.get(key)
        if text is None or not text.strip():
            raise TableError(f"{path} line {line}: no {key} (expected {expected})")
        try:
            row[key] = parse(text.strip())
        except ValueError:
            raise TableError(f"{path} line {line}: {key} is {text.strip()!r}, not {what} (expected {expected})") from None
    if path.name == "roi.csv" and (row["width"] <= 0 or row["height"] <= 0):
        raise TableError(f"{path} line {line}: a {row['width']}x{row['height']} region; width and height must be "
                         f"positive (expected {expected})")
    return row


def check_tables(root: Path) -> None:
    """Read every CSV of ``TABLES`` in the data folder ``root``; TableError on the first bad row."""
    for name in TABLES:
        read_table(root / name)


def image_points(data_dir: Path, name: str, csv_rows: list[dict] | None,
                 have_csv: bool, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Flower centres (N, 2) of one image: points.csv rows, else its red-cross copy.

    An image with neither is flowerless when a points.csv exists (a CSV has no row for an
    image without flowers), and a PhotoError otherwise (nothing says it was annotated at all).
    """
    if csv_rows:
        return np.array([[float(r["x"]), float(r["y"])] for r in csv_rows]).reshape(-1, 2)
    crossed = data_dir / "annotated" / name
    if not crossed.exists():
        crossed = crossed.with_suffix(".png")
    if crossed.exists():
        try:
            return red_cross_points(read_photo(crossed, max_pixels))
        except PhotoError as exc:
            raise PhotoError(exc.kind, f"its annotated copy {crossed.name}: {exc}") from None
    if have_csv:
        return np.zeros((0, 2))
    raise PhotoError("no_annotation", f"no row in points.csv (there is none) and no annotated/{crossed.name}")


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
    ``orchard.skipped.SkippedFile`` (name, kind, reason), never the end of the task.

    ``data_dir`` is a folder or an ``orchard.storage.Storage``: a task on another node reads the
    field through storage (copied once per node), never a path only the driver has."""
    from orchard.skipped import SkippedFile

    root = data_dir.localize() if hasattr(data_dir, "localize") else Path(data_dir)
    points_csv = read_table(root / "points.csv")
    roi_csv = read_table(root / "roi.csv")
    distractor_csv = read_table(root / "distractors.csv")
    all_tiles, index_rows, point_rows, skipped = [], [], [], []
    for name in names:
        try:
            rgb = read_photo(root / "images" / name, max_pixels)
            points = image_points(root, name, points_csv.get(name), (root / "points.csv").exists(), max_pixels)
        except PhotoError as exc:
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


def prepare_tiles(data_dir: str | Path, out_dir: str | Path, tile_size: int, roi: list[int] | None,
                  images_per_task: int = 4, parallel: bool = True,
                  max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Path:
    """Tile every image of data_dir, one Ray task per `images_per_task` images (parallel=False:
    in this process, for tools that run without Ray); write the cache under out_dir/tiles, with
    the photos that could not be read in tiles/skipped.csv (``TileSet.skipped``)."""
    from orchard import skipped as skip_log

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
        from orchard import skipped as skip_log

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
