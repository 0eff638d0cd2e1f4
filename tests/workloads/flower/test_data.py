"""Ground truth, annotations, tiling and bin sampling on real files (PNG, CSV)."""
import numpy as np
import pytest

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
