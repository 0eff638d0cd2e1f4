"""Settings that would only fail late (inside a Ray task or a Train worker), refused before Ray
starts with one line naming the keys to change (``orchard.ConfigError``, exit 2).

- the CSVs of ``flower.data_dir`` (points.csv, roi.csv, distractors.csv) hold what their format
  says: a bad row is named by file and line (``data.TableError``);
- the tile must fit the field: the synthetic frame, ``flower.roi``, or every image's region of
  interest in ``flower.data_dir`` (read from the image headers; a photo whose header cannot be
  read is left to the tiling step to skip and count, unless too many are: ``enough_photos``);
- the tiles there must give every worker at least one batch (an upper bound here, before any
  tile exists; the driver checks the bin-sampled count again before Train starts);
- precision and GPU settings that NCCL or the parameter servers cannot run;
- a CUDA ``flower.eval_device`` this process cannot see: the test set is counted here, on the
  driver, after the whole training.
"""
from __future__ import annotations

from pathlib import Path

from orchard.api import ConfigError


def check(cfg: dict) -> None:
    """Every check of this module, for a train run's resolved config."""
    check_precision(cfg)
    check_gpus(cfg)
    check_eval_device(cfg)
    if cfg["flower"]["data_dir"] is None:
        total = synthetic_tiles(cfg)
        where = "the synthetic field (flower.synthetic.num_images x its tiles)"
    else:
        total = data_dir_tiles(cfg)
        where = f"{cfg['flower']['data_dir']}"
    if total is not None:
        check_tiles_per_worker(cfg, total, where)


def check_precision(cfg: dict) -> None:
    if cfg["flower"]["precision"] == "fp16" and cfg["strategy"]["name"] == "ps":
        raise ConfigError("flower.precision", "fp32 or bf16 with strategy=ps (fp16 needs a loss scaler on a torch "
                          "optimizer, and the servers apply the raw gradients); or strategy=ring, got 'fp16'")


def check_gpus(cfg: dict) -> None:
    """NCCL needs a whole GPU per rank ("Duplicate GPU detected"); ``backend=auto`` falls back
    to gloo by itself (orchard/strategies/launch.py), an explicit ``nccl`` is refused."""
    s = cfg["strategy"]
    gpus = float(s.get("gpus_per_worker", 0) or 0)
    if 0 < gpus < 1 and s.get("backend") == "nccl":
        raise ConfigError("strategy.backend", f"gloo when strategy.gpus_per_worker={gpus:g} (workers sharing a GPU: "
                          "NCCL needs one GPU per worker), or strategy.gpus_per_worker=1, got 'nccl'")


def check_eval_device(cfg: dict) -> None:
    """``flower.eval_device=cuda[:i]`` names a GPU of the process that counts the test set (the
    driver, run.py, once training ended): one it cannot see failed there, after the whole
    training. ``auto`` needs no check (the CPU where no GPU is seen)."""
    import re

    device = str(cfg["flower"].get("eval_device", "auto"))
    if not device.startswith("cuda"):
        return
    import torch

    seen = torch.cuda.device_count()   # 0 for a torch without CUDA or a machine without GPUs
    found = re.fullmatch(r"cuda(?::(\d+))?", device)
    if found is None or int(found.group(1) or 0) >= seen:
        gpus = f"sees {seen} CUDA GPU{'s' if seen != 1 else ''} (cuda:0..cuda:{seen - 1})" if seen else "sees no CUDA GPU"
        raise ConfigError("flower.eval_device", f"auto or cpu: the test set is counted in this process after "
                          f"training, and it {gpus}; got {device!r}")


def synthetic_tiles(cfg: dict) -> int:
    """Tiles the synthetic field will make; refuses a tile larger than its frame."""
    from .synthetic_field import field_window

    f, s = cfg["flower"], cfg["flower"]["synthetic"]
    tile = f["tile_size"]
    if min(s["height"], s["width"]) < tile:
        raise ConfigError("flower.tile_size", f"at most {min(s['height'], s['width'])}: one tile must fit the "
                          f"{s['width']}x{s['height']} synthetic field (or larger flower.synthetic.width/height), "
                          f"got {tile}")
    _, _, width, height = field_window(s["height"], s["width"], tile)
    return s["num_images"] * (width // tile) * (height // tile)


def data_dir_tiles(cfg: dict) -> int | None:
    """Tiles the user's images will make (their headers only); refuses a bad CSV row, too many
    unreadable photos and an image whose region of interest is smaller than a tile. None for a
    folder in remote storage (not read here: the driver checks its CSVs, ``check_tables``)."""
    from orchard.api import is_uri

    f = cfg["flower"]
    if is_uri(f["data_dir"]):
        return None
    from orchard.api import LeavesFolder, SkippedFile, inside_folder
    from .data import PhotoError, list_images, photo_size, read_table
    from .tiles import region_of_interest

    root, tile = Path(f["data_dir"]), f["tile_size"]
    check_tables(root)
    rois = read_table(root / "roi.csv")
    names = list_images(root)
    if not names:
        raise ConfigError("flower.data_dir", f"a folder whose images/ holds field photos; none in {root / 'images'}")
    total, unreadable = 0, []
    for name in names:
        try:
            width, height = photo_size(inside_folder(root / "images" / name, root), f["max_image_pixels"])
        except (PhotoError, LeavesFolder) as exc:  # skipped and counted by the tiling step (tiles.tile_images)
            unreadable.append(SkippedFile(name, exc.kind, str(exc)))
            continue
        window = f["roi"]
        key = "flower.roi" if window is not None else "flower.tile_size"
        if window is None and name in rois:
            r = rois[name][0]
            window = [r["x"], r["y"], r["width"], r["height"]]
        try:
            _, _, w, h = region_of_interest((height, width), tile, window)
        except ValueError as exc:
            fix = "a window of whole tiles inside every image" if key == "flower.roi" else "a smaller tile"
            raise ConfigError(key, f"{fix}: {name}: {exc}") from None
        total += (w // tile) * (h // tile)
    enough_photos(cfg, unreadable, len(names))
    return total


def check_tables(root) -> None:
    """The data folder's CSVs, whole: a bad row is one line naming the file, the line and what
    was expected (ConfigError on ``flower.data_dir``). ``root``: a local folder."""
    from .data import TableError
    from .data import check_tables as read_all

    try:
        read_all(Path(root))
    except TableError as exc:
        raise ConfigError("flower.data_dir", str(exc)) from None


def enough_photos(cfg: dict, skipped: list, total: int) -> None:
    """Refuse (ConfigError on ``flower.data_dir``, one line naming the first bad photo and the
    count) when none of the ``total`` photos, or too few (``flower.max_skipped_fraction``), can
    be read; ``skipped``: ``orchard.tracking.skipped.SkippedFile`` rows."""
    from orchard.api import too_many_skipped

    problem = too_many_skipped(skipped, total, cfg["flower"]["max_skipped_fraction"],
                               "flower.max_skipped_fraction", f"photos in {cfg['flower']['data_dir']}/images")
    if problem:
        raise ConfigError("flower.data_dir", problem)


def check_tiles_per_worker(cfg: dict, total: int, where: str) -> None:
    """At least one batch per worker from the most the split can leave for training."""
    f, workers = cfg["flower"], int(cfg["strategy"]["num_workers"])
    most = int(total * f["train_fraction"] * (1 - f["val_fraction"]))
    if most // workers < f["batch_size"]:
        raise ConfigError("flower.batch_size", f"at most {most // workers}: {total} tiles from {where} leave at most "
                          f"{most} training tiles for {workers} workers (or more images, a smaller "
                          f"flower.tile_size, fewer strategy.num_workers), got {f['batch_size']}")


def enough_tiles_per_worker(cfg: dict, train_tiles: int) -> None:
    """Refuse (ConfigError: the run FAILED, one line, exit 2) before Ray Train starts when the
    bin-sampled training tiles give a worker less than one batch."""
    f, workers = cfg["flower"], int(cfg["strategy"]["num_workers"])
    per_worker = train_tiles // workers
    if per_worker < f["batch_size"]:
        raise ConfigError("flower.batch_size", f"at most {per_worker} here: bin sampling left {train_tiles} training "
                          f"tiles for {workers} workers (or: more flower.synthetic.num_images, a smaller "
                          f"flower.tile_size, fewer strategy.num_workers)")
