"""workloads/flower/data.py: the user's data as it comes. Ground truth, annotations, tiling and bin
sampling on real files (PNG, CSV); and bad data in a user's flower.data_dir (docs/flower.md, "Bad
data"): a photo that cannot be read is skipped and counted, the run fails only when too few are
left; a CSV row that is not what its format says is one line naming the file and the line, exit 2,
before Ray starts; a photo over flower.max_image_pixels is refused by name, never a
DecompressionBombError."""
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from orchard import ConfigError
from orchard.tracking.skipped import SkippedFile
from workloads.flower.data import read_rgb, red_cross_points
from workloads.flower.density_map import density_map
from workloads.flower.synthetic_field import draw_red_crosses, generate_field
from workloads.flower.tiles import (TileSet, assign_bins, bin_sample, region_of_interest, split_into_tiles,
                                    tile_images)


@pytest.mark.parametrize("points", [
    [],
    [(10.0, 12.0)],
    [(0.0, 0.0), (31.9, 31.9), (0.5, 20.0), (16.0, 31.0)],   # on and near every border
    [(5.0, 5.0)] * 3 + [(20.2, 7.7)],                        # stacked flowers count separately
])
def test_density_map_sums_to_the_annotated_count_even_at_the_border(points):
    d = density_map(np.array(points).reshape(-1, 2), 32, 32, sigma=3.0)
    assert d.shape == (32, 32)
    assert d.sum() == pytest.approx(len(points), abs=1e-4)
    assert (d >= 0).all()


def test_density_map_peaks_at_the_flower():
    d = density_map(np.array([[20.0, 7.0]]), 32, 40, sigma=2.0)
    row, col = np.unravel_index(np.argmax(d), d.shape)
    assert (row, col) == (7, 20)


def test_red_crosses_round_trip_through_a_png(tmp_path):
    import cv2

    rgb = np.full((60, 80, 3), (60, 110, 40), np.uint8)
    points = np.array([[10, 10], [40, 30], [43, 31], [78, 59], [0, 25]], float)  # touching pair, 2 cut by the border
    crossed = draw_red_crosses(rgb, points)
    path = tmp_path / "annotated.png"
    cv2.imwrite(str(path), cv2.cvtColor(crossed, cv2.COLOR_RGB2BGR))
    found = red_cross_points(read_rgb(path))
    assert len(found) == len(points)
    for p in points:
        assert np.min(np.linalg.norm(found - p, axis=1)) <= 1.0


def test_region_of_interest_is_whole_tiles_inside_the_image():
    assert region_of_interest((720, 1280, 3), 224, None) == (80, 24, 1120, 672)
    assert region_of_interest((100, 100, 3), 32, [10, 10, 70, 50]) == (13, 19, 64, 32)
    with pytest.raises(ValueError):
        region_of_interest((20, 20, 3), 32, None)


def test_tiles_keep_every_flower_in_the_roi_once():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (100, 140, 3), dtype=np.uint8)
    points = rng.uniform(0, [140, 100], (50, 2))
    roi = (6, 2, 128, 96)
    tiles, meta = split_into_tiles(rgb, points, roi, 32)
    assert tiles.shape == (12, 32, 32, 3)
    assert np.array_equal(tiles[5], rgb[2 + 32:2 + 64, 6 + 32:6 + 64])  # row 1, col 1
    inside = ((points[:, 0] >= 6) & (points[:, 0] < 134) & (points[:, 1] >= 2) & (points[:, 1] < 98)).sum()
    assert sum(len(p) for _, _, p in meta) == inside
    for _, _, p in meta:
        assert ((p >= 0) & (p < 32)).all()


def test_synthetic_field_writes_what_the_loader_reads(tmp_path, ray_session):
    from workloads.flower.tiles import prepare_tiles

    root = generate_field(tmp_path / "field", num_images=2, height=200, width=300, tile_size=64, seed=3)
    crossed = generate_field(tmp_path / "crossed", num_images=2, height=200, width=300, tile_size=64, seed=3,
                             annotation="red_cross")
    assert (root / "points.csv").exists() and not (crossed / "points.csv").exists()
    cache = prepare_tiles(root, tmp_path / "a", 64, None, images_per_task=1)
    tiles = TileSet(cache)
    assert tiles.images.shape == (2 * 2 * 4, 64, 64, 3)
    assert [int(len(p)) for p in tiles.points] == tiles.counts.tolist()
    # The same scenes annotated with red crosses give (nearly) the same counts.
    from_crosses = tile_images(str(crossed), ["field_0000.png", "field_0001.png"], 64, None)
    counts = np.array([r[4] for r in from_crosses[1]])
    assert np.abs(counts - tiles.counts).sum() <= 0.05 * tiles.counts.sum() + 1
    assert counts.sum() > 0


def test_assign_bins_uses_inclusive_ranges_and_an_open_last_bin():
    bins = [[0, 0], [1, 1], [2, 2], [3, 4], [5, 7], [8, None]]  # Table 4.2
    assert assign_bins(np.array([0, 1, 2, 3, 4, 5, 7, 8, 50]), bins).tolist() == [0, 1, 2, 3, 3, 4, 4, 5, 5]
    assert assign_bins(np.array([9]), [[0, 0], [1, 8]]).tolist() == [-1]


def test_bin_sampling_takes_the_smallest_bin_size_from_every_bin_and_splits_70_30():
    counts = np.array([0] * 50 + [1] * 30 + [2] * 10 + [3] * 20)
    bins = [[0, 0], [1, 1], [2, 2], [3, None]]
    train, test, sizes = bin_sample(counts, bins, 0.7, seed=1)
    assert sizes == [50, 30, 10, 20]
    both = np.concatenate([train, test])
    assert len(both) == len(set(both.tolist())) == 40
    assert np.bincount(counts[both].clip(max=3)).tolist() == [10, 10, 10, 10]
    assert len(train) == 28 and len(test) == 12
    again = bin_sample(counts, bins, 0.7, seed=1)
    assert again[0].tolist() == train.tolist()
    assert bin_sample(counts, bins, 0.7, seed=2)[0].tolist() != train.tolist()


@pytest.mark.slow
def test_tiling_streams_tiles_to_disk_without_holding_them_all(tmp_path):
    """The tile cache is written one image group at a time: the peak of what the tiling allocates
    stays under the cache's own size (it held every tile twice before: the groups' and their
    concatenation)."""
    import tracemalloc

    from workloads.flower.tiles import prepare_tiles

    root = generate_field(tmp_path / "field", num_images=32, height=256, width=384, tile_size=64, seed=4)
    tracemalloc.start()
    try:
        cache = prepare_tiles(root, tmp_path / "a", 64, None, images_per_task=1, parallel=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tiles = TileSet(cache)
    assert len(tiles) >= 32 * 10 and tiles.images.shape[1:] == (64, 64, 3)
    assert peak < tiles.images.nbytes
    assert not [p for p in tmp_path.joinpath("a").iterdir() if ".tmp-" in p.name]   # no partial cache left
    whole = tile_images(str(root), [f"field_{i:04d}.png" for i in range(32)], 64, None)[0]
    np.testing.assert_array_equal(tiles.images, whole)                             # the same tiles, in order


ROOT = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- fixtures: the bad files
@pytest.fixture(scope="module")
def field(tmp_path_factory) -> Path:
    """Four good synthetic field photos (576 x 384, the smoke size) with points.csv and roi.csv."""
    from workloads.flower.synthetic_field import generate_field

    return generate_field(tmp_path_factory.mktemp("flower") / "field", num_images=4, height=384, width=576,
                          tile_size=64, seed=5, mean_flowers_per_tile=2.0)


@pytest.fixture
def data(field, tmp_path) -> Path:
    """A copy of ``field`` the test may break."""
    return Path(shutil.copytree(field, tmp_path / "data"))


def truncate(path: Path, keep: int = 300) -> None:
    """What a copy cut short leaves: the header and a little of the pixels."""
    path.write_bytes(path.read_bytes()[:keep])


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels (an orthomosaic's header) and holds almost none."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def validate(compose, data: Path, *overrides: str) -> dict:
    from workloads import flower

    cfg = compose("workload=flower", "debug=smoke", f"flower.data_dir={data}", *overrides)
    flower.validate(cfg)
    return cfg


# --------------------------------------------------------------------------- reading one photo
def test_each_kind_of_unreadable_photo_is_a_photo_error_with_its_kind(data, tmp_path):
    from workloads.flower.data import PhotoError, read_photo

    good = data / "images" / "field_0000.png"
    jpeg = tmp_path / "cut.jpg"
    Image.open(good).convert("RGB").save(jpeg, quality=90)
    truncate(jpeg, 5000)  # cv2 would decode it, grey below the cut
    png = tmp_path / "cut.png"
    png.write_bytes(good.read_bytes()[:300])
    (tmp_path / "notes.png").write_text("not an image\n")
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "gone.png").symlink_to(tmp_path / "nowhere.png")
    expected = {"cut.jpg": "truncated", "cut.png": "truncated", "notes.png": "not_image", "empty.png": "empty",
                "gone.png": "missing"}
    for name, kind in expected.items():
        with pytest.raises(PhotoError) as err:
            read_photo(tmp_path / name)
        assert err.value.kind == kind, name
        assert "\n" not in str(err.value)
    rgb = read_photo(good)
    assert rgb.shape == (384, 576, 3) and rgb.dtype == np.uint8


def test_a_photo_over_max_image_pixels_is_refused_from_its_header(tmp_path, monkeypatch):
    from workloads.flower.data import DEFAULT_MAX_PIXELS, PhotoError, photo_size, read_photo

    pil_limit = Image.MAX_IMAGE_PIXELS
    ortho = tmp_path / "ortho.png"
    ortho.write_bytes(png_header(20_000, 15_000))  # 300 MP: over PIL's bomb limit, which would raise
    for read in (photo_size, read_photo):
        with pytest.raises(PhotoError) as err:
            read(ortho, DEFAULT_MAX_PIXELS)
        assert err.value.kind == "too_large"
        assert "20000x15000" in str(err.value) and "flower.max_image_pixels" in str(err.value)
    assert photo_size(ortho, None) == (20_000, 15_000)          # null: no limit, PIL's own check off too
    assert photo_size(ortho, 400_000_000) == (20_000, 15_000)
    assert Image.MAX_IMAGE_PIXELS == pil_limit  # PIL's global is left as it was
    # the key governs, not PIL's global: a small global does not refuse a photo the key allows
    small = tmp_path / "small.png"
    Image.new("RGB", (120, 80), (10, 200, 30)).save(small)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert read_photo(small, None).shape == (80, 120, 3)
    assert Image.MAX_IMAGE_PIXELS == 1000
    with pytest.raises(PhotoError, match="too_large|over flower.max_image_pixels"):
        read_photo(small, 9_000)


def test_a_phone_photo_is_read_upright_as_cv2_reads_it(tmp_path):
    import cv2

    from workloads.flower.data import photo_size, read_photo

    path = tmp_path / "portrait.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown rotated a quarter turn
    Image.new("RGB", (120, 80), (200, 30, 30)).save(path, exif=exif, quality=95)
    assert photo_size(path) == (80, 120)
    rgb = read_photo(path)
    assert rgb.shape == cv2.imread(str(path)).shape == (120, 80, 3)


# --------------------------------------------------------------------------- tiling skips and counts
def test_tiling_skips_a_truncated_photo_and_keeps_the_rest(data, tmp_path):
    from workloads.flower.tiles import TileSet, prepare_tiles

    truncate(data / "images" / "field_0001.png")
    (data / "images" / "field_0002.png").write_bytes(png_header(30_000, 30_000))
    cache = prepare_tiles(data, tmp_path / "out", 64, None, parallel=False)
    tiles = TileSet(cache)
    assert tiles.skipped == [SkippedFile("field_0001.png", "truncated", "image file is truncated"),
                             SkippedFile("field_0002.png", "too_large", tiles.skipped[1].reason)]
    assert tiles.photos == 2 and len(tiles) == 2 * 40    # 2 good photos x (512 x 320 ROI / 64 px tiles)
    assert (cache / "skipped.csv").read_text().startswith("file,kind,reason\n")


def test_a_photo_linked_from_outside_the_data_folder_is_skipped_and_counted_never_read(data, tmp_path):
    """A link in images/ to a photo elsewhere (another user's, or /etc/passwd) is not tiled or
    trained on: skipped as ``outside_folder``, like any photo that cannot be used."""
    from workloads.flower.tiles import TileSet, prepare_tiles

    elsewhere = tmp_path / "elsewhere.png"
    shutil.move(data / "images" / "field_0001.png", elsewhere)
    (data / "images" / "field_0001.png").symlink_to(elsewhere)
    (data / "images" / "passwd.png").symlink_to("/etc/passwd")
    (data / "images" / "inside.png").symlink_to(data / "images" / "field_0002.png")  # inside: used
    tiles = TileSet(prepare_tiles(data, tmp_path / "out", 64, None, parallel=False))
    assert [(s.file, s.kind) for s in tiles.skipped] == [("field_0001.png", "outside_folder"),
                                                         ("passwd.png", "outside_folder")]
    assert tiles.photos == 4


def test_skipped_files_are_counted_by_kind_and_too_many_is_one_line():
    from orchard.tracking.skipped import metrics, too_many_skipped

    rows = [SkippedFile("a.png", "truncated", "image file is truncated"), SkippedFile("b.png", "not_image", "x"),
            SkippedFile("c.png", "truncated", "image file is truncated")]
    assert metrics(rows) == {"data/skipped_files": 3.0, "data/skipped_files/truncated": 2.0, "data/skipped_files/not_image": 1.0}
    assert metrics([]) == {"data/skipped_files": 0.0}
    assert too_many_skipped(rows, 10, 0.5, "k") == ""
    line = too_many_skipped(rows, 5, 0.5, "flower.max_skipped_fraction", "photos")
    assert "3 of 5" in line and "a.png" in line and "flower.max_skipped_fraction=0.5" in line and "\n" not in line
    assert "none of the 3" in too_many_skipped(rows, 3, 1.0, "k")


def test_skipped_csv_round_trips(tmp_path):
    from orchard.tracking.skipped import read_csv, write_csv

    rows = [SkippedFile("a, b.png", "corrupt", 'broken "IDAT" chunk')]
    assert read_csv(write_csv(rows, tmp_path / "skipped.csv")) == rows
    assert read_csv(tmp_path / "absent.csv") == []


# --------------------------------------------------------------------------- the config check, before Ray
def test_one_truncated_photo_passes_the_config_check(data, compose):
    truncate(data / "images" / "field_0000.png")
    validate(compose, data)  # skipped and counted later, not refused


def test_too_many_unreadable_photos_fail_before_ray_naming_the_first(data, compose):
    (data / "images" / "field_0001.png").write_text("oops")
    (data / "images" / "field_0002.png").write_bytes(png_header(30_000, 30_000))
    (data / "images" / "field_0003.png").write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        validate(compose, data)
    message = str(err.value)
    assert err.value.key == "flower.data_dir" and "\n" not in message
    assert "3 of 4" in message and "first: field_0001.png" in message and "not_image" in message
    validate(compose, data, "flower.max_skipped_fraction=0.75")  # the bound is a config key


def test_an_orthomosaic_alone_is_refused_by_name(data, compose):
    for p in (data / "images").iterdir():
        p.unlink()
    (data / "images" / "ortho.png").write_bytes(png_header(25_000, 20_000))
    with pytest.raises(ConfigError) as err:
        validate(compose, data)
    assert "ortho.png" in str(err.value) and "flower.max_image_pixels" in str(err.value)
    assert "DecompressionBomb" not in str(err.value)


@pytest.mark.parametrize("table, line, says", [
    ("points.csv", "{image},12.5,abc\n", "y is 'abc', not a number"),
    ("points.csv", "{image},12.5\n", "no y"),
    ("roi.csv", "{image},32,abc,512,320\n", "y is 'abc', not a whole number"),
    ("roi.csv", "{image},32,32,0,320\n", "a 0x320 region; width and height must be positive"),
    ("distractors.csv", "{image},glare,1,2,x,4\n", "width is 'x', not a whole number"),
])
def test_a_bad_csv_row_is_named_by_file_and_line(data, compose, table, line, says):
    path = data / table
    lines = len(path.read_text().splitlines())
    with open(path, "a") as fh:
        fh.write(line.format(image="field_0001.png"))
    with pytest.raises(ConfigError) as err:
        validate(compose, data)
    message = str(err.value)
    assert err.value.key == "flower.data_dir" and "\n" not in message
    assert f"{path} line {lines + 1}: {says}" in message and "(expected image," in message


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe" * 50, b'{"points": [[1, 2]]}\n',
                                     b"a;b;c\n1;2;3\n"])
def test_a_points_csv_that_is_not_a_table_is_one_line(data, compose, content):
    (data / "points.csv").write_bytes(content)
    with pytest.raises(ConfigError) as err:
        validate(compose, data)
    assert str(data / "points.csv") in str(err.value) and "image,x,y" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_cli_refuses_a_bad_points_row_with_exit_2_and_no_traceback(data, tmp_path):
    with open(data / "points.csv", "a") as fh:
        fh.write("field_0001.png,12.5,abc\n")
    proc = subprocess.run([sys.executable, "-m", "orchard", "workload=flower", "debug=smoke", f"flower.data_dir={data}",
                           "tracking=none", f"output_dir={tmp_path}/out"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 2, console
    assert "traceback" not in console.lower()
    named = [line for line in console.splitlines() if "points.csv" in line]
    assert len(named) == 1 and named[0].startswith("orchard: bad config: flower.data_dir: ")
    assert f"{data / 'points.csv'} line " in named[0] and "y is 'abc'" in named[0]
    assert not (tmp_path / "out" / "logs").exists()  # refused before the console moved to a log: before Ray


def test_csvs_in_remote_storage_are_checked_before_tiling_and_named_by_uri(data, s3_env, monkeypatch):
    for key, value in s3_env.items():  # the moto server of tests/conftest.py
        monkeypatch.setenv(key, value)
    from orchard.storage import Storage
    from workloads.flower.data import check_remote_tables

    store = Storage("s3://orchard/fields")
    store.upload(data, "good")
    check_remote_tables(store.child("good"))
    with open(data / "roi.csv", "a") as fh:
        fh.write("field_0001.png,32,abc,512,320\n")
    store.upload(data, "bad")
    with pytest.raises(ConfigError) as err:
        check_remote_tables(store.child("bad"))
    assert "s3://orchard/fields/bad/roi.csv line 6: y is 'abc'" in str(err.value)


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_a_smoke_run_with_a_truncated_photo_finishes_and_counts_it(data, run_orchard):
    truncate(data / "images" / "field_0002.png")
    result = run_orchard("workload=flower", "debug=smoke", "flower.epochs=1", f"flower.data_dir={data}")
    assert result.exit_code == 0, result.outcome
    assert result.run.info.status == "FINISHED"
    m = result.run.data.metrics
    assert m["data/skipped_files"] == 1.0 and m["data/skipped_files/truncated"] == 1.0
    assert "skipped.csv" in result.artifacts()
    local = result.client.download_artifacts(result.run.info.run_id, "skipped.csv", str(data.parent))
    assert Path(local).read_text().splitlines() == ["file,kind,reason", "field_0002.png,truncated,image file is truncated"]
    assert int(result.run.data.params["flower.tiles_total"]) == 3 * 40
