"""The user's field data: photos and their annotations, read and checked; and the synthetic field.

On-disk input (the real format; `synthetic_field.py` writes the same):
    images/<name>.(png|jpg)        field photographs
    points.csv                     image,x,y flower centres in image pixels, and/or
    annotated/<name>.png           copies with pure-red crosses on each flower (3.3.2)
    roi.csv (optional)             image,x,y,width,height region of interest (3.3.1)
    distractors.csv (optional)     image,kind,x,y,width,height (tags tiles for per-scene metrics)
The photos are cut into the tile cache the workers train on by `tiles.py`.

Bad data (docs/flower.md): the CSVs are checked whole before Ray starts and a bad row is one
line naming the file, the line and what was expected (``TableError``, exit 2); a photo that
cannot be read (truncated, not an image, over ``flower.max_image_pixels``) is skipped and
counted by kind (``PhotoError``, ``orchard.tracking.skipped``), never the end of the run by itself.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
from collections import defaultdict
from pathlib import Path

import cv2
import numpy as np

from orchard.api import atomic_folder, Storage

from .synthetic_field import generate_field

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
DEFAULT_MAX_PIXELS = 178_956_970  # PIL's own refusal (2 x Image.MAX_IMAGE_PIXELS); flower.max_image_pixels


def read_rgb(path: str | Path) -> np.ndarray:
    """An image file as RGB uint8 (H, W, 3)."""
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise FileNotFoundError(f"cannot read image {path}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


# --------------------------------------------------------------------------- photos that cannot be read
class PhotoError(ValueError):
    """A photo that cannot be used; ``kind`` is the key of ``data/skipped_files/<kind>``: missing, empty,
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
    from orchard.api import one_line

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


def check_remote_tables(data: Storage) -> None:
    """The CSVs of a data folder in remote storage, checked as the config check does a local
    one's (preflight.check_tables): a bad row is ConfigError, exit 2, before any tile is made."""
    import tempfile

    from orchard.api import ConfigError

    with tempfile.TemporaryDirectory(prefix="orchard-flower-csv-") as tmp:
        for name in TABLES:
            if data.exists(name):
                (Path(tmp) / name).write_bytes(data.read_bytes(name))
        try:
            check_tables(Path(tmp))
        except TableError as exc:  # named by its URI, not the copy read here
            raise ConfigError("flower.data_dir", str(exc).replace(tmp, data.uri.rstrip("/"))) from None


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
            from orchard.api import inside_folder

            return red_cross_points(read_photo(inside_folder(crossed, data_dir), max_pixels))  # LeavesFolder: skipped
        except PhotoError as exc:
            raise PhotoError(exc.kind, f"its annotated copy {crossed.name}: {exc}") from None
    if have_csv:
        return np.zeros((0, 2))
    raise PhotoError("no_annotation", f"no row in points.csv (there is none) and no annotated/{crossed.name}")


# --------------------------------------------------------------------------- the synthetic field
def synthetic_data(cfg: dict) -> Path:
    """The synthetic field for this config as a folder on this machine (see synthetic_storage)."""
    return synthetic_storage(cfg)[0].localize()


def synthetic_storage(cfg: dict) -> tuple[Storage, bool]:
    """The synthetic field for this config, generated once and kept in the run storage
    (``<storage root>/flower_data/synthetic-<key>``); returns (its folder, True if it was there).

    The folder name hashes every setting that changes the images, so runs that differ only in
    strategy or training knobs (the strategy comparison) train on identical tiles, and runs on
    other machines with the same ``storage.uri`` find them too.
    """
    f = cfg["flower"]
    settings = {"synthetic": f["synthetic"], "tile_size": f["tile_size"], "seed": cfg["seed"]}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    store = Storage.root(cfg).child("flower_data", f"synthetic-{digest}")
    if store.ready("images"):
        return store, True
    if not store.is_local:  # generate here, then publish the folder (marked complete last)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="orchard-flower-") as tmp:
            _generate(cfg, Path(tmp) / "field")
            store.upload(Path(tmp) / "field")
            store.write_bytes("images/_COMPLETE", b"complete\n")  # what ready("images") looks for
        return store, False
    # a concurrent run sees all of it or none of it; one that published it first keeps its copy
    with atomic_folder(store.local_path, keep_existing=True) as partial:
        _generate(cfg, partial)
    return store, False


def _generate(cfg: dict, partial: Path) -> None:
    f = cfg["flower"]
    s = f["synthetic"]
    generate_field(partial, num_images=s["num_images"], height=s["height"], width=s["width"],
                   tile_size=f["tile_size"], seed=cfg["seed"], mean_flowers_per_tile=s["mean_flowers_per_tile"],
                   flower_radius=tuple(s["flower_radius"]), occlusion=s["occlusion"],
                   distractor_rate=s["distractor_rate"], annotation=s["annotation"])
