"""Real PNG format, the paper's preprocessing, and the synthetic avatar renderer."""
import cv2
import numpy as np
import pytest

from tests.workloads.forest.helpers import palette, write_corpus
from workloads.forest.avatar import render_avatar_image
from workloads.forest.body_parts import BACKGROUND, LEFT_RIGHT_SWAP, PART_INDEX, PART_NAMES
from workloads.forest.data_unit import build_block, tree_selection
from workloads.forest.depth_png import add_noise, compose, flip, read_pair, write_pair


def test_png_pair_round_trip_is_16_bit_depth_and_palette_colours(tmp_path, compose):
    pal = palette(compose)
    depth, labels = render_avatar_image([0, 0, 1], 60, 80)
    write_pair(tmp_path / "scene", depth, labels, pal)
    raw = cv2.imread(str(tmp_path / "scene_depth.png"), cv2.IMREAD_UNCHANGED)
    assert raw.dtype == np.uint16 and raw.max() > 1000       # millimetres, not 8-bit
    rgb = cv2.imread(str(tmp_path / "scene_labels.png"))[..., ::-1]
    assert tuple(rgb[labels == BACKGROUND][0]) == tuple(pal[BACKGROUND])
    d2, l2 = read_pair(tmp_path / "scene", pal)
    np.testing.assert_array_equal(d2, depth)
    np.testing.assert_array_equal(l2, labels)


def test_unknown_label_colour_and_8_bit_depth_are_rejected(tmp_path, compose):
    pal = palette(compose)
    depth, labels = render_avatar_image([0, 0, 2], 60, 80)
    write_pair(tmp_path / "a", depth, labels, pal)
    bad = cv2.imread(str(tmp_path / "a_labels.png"))
    bad[0, 0] = (1, 2, 3)
    cv2.imwrite(str(tmp_path / "a_labels.png"), bad)
    with pytest.raises(ValueError, match="not in the palette"):
        read_pair(tmp_path / "a", pal)
    write_pair(tmp_path / "b", depth, labels, pal)
    cv2.imwrite(str(tmp_path / "b_depth.png"), (depth // 256).astype(np.uint8))
    with pytest.raises(ValueError, match="16-bit"):
        read_pair(tmp_path / "b", pal)


def test_flip_mirrors_depth_and_swaps_left_right_labels():
    depth, labels = render_avatar_image([0, 0, 3], 60, 80)
    fd, fl = flip(depth, labels)
    np.testing.assert_array_equal(fd, depth[:, ::-1])
    left_hand, right_hand = PART_INDEX["L_hand"], PART_INDEX["R_hand"]
    np.testing.assert_array_equal(fl == right_hand, (labels == left_hand)[:, ::-1])
    assert LEFT_RIGHT_SWAP[PART_INDEX["LU_torso"]] == PART_INDEX["RU_torso"]
    assert LEFT_RIGHT_SWAP[PART_INDEX["neck"]] == PART_INDEX["neck"]
    assert LEFT_RIGHT_SWAP[BACKGROUND] == BACKGROUND
    np.testing.assert_array_equal(flip(fd, fl)[1], labels)     # flipping twice is the identity


def test_compose_keeps_the_nearer_surface_and_noise_keeps_no_reading():
    a_d, a_l = np.zeros((4, 6), np.uint16), np.full((4, 6), BACKGROUND, np.uint8)
    a_d[:, 1:3], a_l[:, 1:3] = 3000, PART_INDEX["neck"]
    b_d, b_l = np.zeros_like(a_d), np.full_like(a_l, BACKGROUND)
    b_d[:, 0:2], b_l[:, 0:2] = 2000, PART_INDEX["L_foot"]
    d, lab = compose(a_d, a_l, b_d, b_l, 1)              # B moves to columns 1-2, in front of A
    assert (d[:, 1:3] == 2000).all() and (lab[:, 1:3] == PART_INDEX["L_foot"]).all()
    d, lab = compose(b_d, b_l, a_d, a_l, -1)             # A moves to columns 0-1, behind B
    assert (d[:, 0:2] == 2000).all() and (d[:, 2] == 0).all()
    noisy = add_noise(a_d, np.random.default_rng(0), 3.0, 0.0)
    assert (noisy[a_d == 0] == 0).all() and np.abs(noisy.astype(int) - a_d)[a_d > 0].max() < 100


def test_avatar_renders_most_parts_with_the_persons_left_on_the_image_right():
    seen = set()
    for i in range(6):
        depth, labels = render_avatar_image([5, 0, i], 120, 160)
        body = labels != BACKGROUND
        assert body.sum() > 500
        assert 1500 <= np.median(depth[body]) <= 4500         # 1.8 - 4 m away, in mm
        assert (depth[~body] == 0).all()
        seen |= set(np.unique(labels[body]).tolist())
        cols = np.arange(160)[None, :].repeat(120, 0)
        assert cols[labels == PART_INDEX["LU_torso"]].mean() > cols[labels == PART_INDEX["RU_torso"]].mean()
    assert len(seen) >= 28, sorted(PART_NAMES[i] for i in set(range(31)) - seen)


def test_data_unit_block_samples_body_pixels_and_tree_selection_is_deterministic(tmp_path, compose):
    pal = palette(compose)
    stems = write_corpus(tmp_path, 3, pal)
    settings = {"flip_prob": 1.0, "compose_prob": 1.0, "clutter_prob": 1.0, "clutter_objects": 2,
                "noise_sigma_mm": 3.0, "dropout": 0.01}
    block = build_block([str(s) for s in stems], [0, 1, 2], 7, 0, pal, settings, 100, keep_labels=True)
    again = build_block([str(s) for s in stems], [0, 1, 2], 7, 0, pal, settings, 100, keep_labels=True)
    np.testing.assert_array_equal(block["depths"], again["depths"])   # preprocessing is seeded
    assert len(block["ex_img"]) == 300
    ex_labels = block["labels"][block["ex_img"], block["ex_y"], block["ex_x"]]
    np.testing.assert_array_equal(ex_labels, block["ex_cls"])
    assert (ex_labels != BACKGROUND).all()
    assert (block["depths"][block["ex_img"], block["ex_y"], block["ex_x"]] > 0).all()
    # clutter gave the background depth readings, still labelled background
    assert (block["depths"][block["labels"] == BACKGROUND] > 0).mean() > 0.5
    m1 = tree_selection(block, seed=0, tree_index=1, image_fraction=0.7, pixel_fraction=0.5)
    m2 = tree_selection(block, seed=0, tree_index=1, image_fraction=0.7, pixel_fraction=0.5)
    m3 = tree_selection(block, seed=0, tree_index=2, image_fraction=0.7, pixel_fraction=0.5)
    np.testing.assert_array_equal(m1, m2)
    assert not np.array_equal(m1, m3) and 0 < m1.mean() < 0.8


def test_corrupt_and_mismatched_pairs_are_skipped_and_named(tmp_path, compose):
    pal = palette(compose)
    stems = write_corpus(tmp_path, 3, pal)
    good = stems[0]
    (tmp_path / "broken_depth.png").write_bytes((tmp_path / f"{good.name}_depth.png").read_bytes()[:300])
    (tmp_path / "broken_labels.png").write_bytes((tmp_path / f"{good.name}_labels.png").read_bytes())
    cv2.imwrite(str(tmp_path / "small_depth.png"), np.full((40, 50), 2000, np.uint16))
    (tmp_path / "small_labels.png").write_bytes((tmp_path / f"{good.name}_labels.png").read_bytes())
    names = [str(s) for s in stems] + [str(tmp_path / "broken"), str(tmp_path / "small")]
    block = build_block(names, list(range(5)), 0, 0, pal, {"flip_prob": 0.0, "compose_prob": 0.0,
                        "clutter_prob": 0.0, "clutter_objects": 0, "noise_sigma_mm": 0.0, "dropout": 0.0},
                        50, keep_labels=False)
    assert len(block["image_ids"]) == 3 and list(block["image_ids"]) == [0, 1, 2]
    skipped = {s.file: s for s in block["skipped"]}          # orchard.tracking.skipped.SkippedFile rows
    assert set(skipped) == {str(tmp_path / "broken"), str(tmp_path / "small")}
    assert "!=" in skipped[str(tmp_path / "small")].reason   # the size mismatch is named
    assert skipped[str(tmp_path / "small")].kind == "size_mismatch" and skipped[str(tmp_path / "broken")].kind == "unreadable"


def test_a_pair_linked_from_outside_its_folder_is_skipped_and_counted(tmp_path, compose):
    pal = palette(compose)
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    stems = write_corpus(data, 2, pal)
    write_corpus(elsewhere, 1, pal)
    for suffix in ("_depth.png", "_labels.png"):
        (data / f"linked{suffix}").symlink_to(next(elsewhere.glob(f"*{suffix}")))
    block = build_block([str(s) for s in stems] + [str(data / "linked")], [0, 1, 2], 0, 0, pal,
                        {"flip_prob": 0.0, "compose_prob": 0.0, "clutter_prob": 0.0, "clutter_objects": 0,
                         "noise_sigma_mm": 0.0, "dropout": 0.0}, 50, keep_labels=False)
    assert list(block["image_ids"]) == [0, 1]
    assert [(s.file, s.kind) for s in block["skipped"]] == [(str(data / "linked"), "outside_folder")]


def test_a_folder_without_body_pixels_is_one_line_and_exit_2(tmp_path, capsys):
    from orchard.cli import main

    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i}_depth.png"), np.full((60, 80), 2500, np.uint16))
        cv2.imwrite(str(tmp_path / f"{i}_labels.png"), np.zeros((60, 80, 3), np.uint8))  # all background
    with pytest.raises(SystemExit) as exit_info:
        main(["workload=forest", "debug=smoke", f"forest.data_dir={tmp_path}", "tracking=none"])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("orchard: bad config: forest.data_dir:") and "body pixel" in err[0]


def test_the_data_steps_last_wave_begins_when_fewer_tasks_are_left_than_cpus(ray_session, tmp_path):
    """load_blocks' `on_last_wave` (where the histogram actors start) runs once fewer data-unit
    tasks are left than the cluster's CPUs: not before (they would take CPUs the data step's full
    waves use), and not only after the last (its idle cores are what the actors' starts take)."""
    import threading
    import time

    import ray

    from workloads.forest.data import last_wave

    @ray.remote(num_cpus=0)
    def unit(gated: bool):
        while gated and not (tmp_path / "go").exists():
            time.sleep(0.02)
        return gated

    cpus = int(ray.cluster_resources()["CPU"])
    reports = [unit.remote(i >= 2) for i in range(cpus + 1)]   # two finish, cpus - 1 wait for the gate
    opens = threading.Timer(60, (tmp_path / "go").touch)   # a last_wave that waited for all ends, and fails
    opens.start()
    last_wave(reports)
    opens.cancel()
    done, left = ray.wait(reports, num_returns=len(reports), timeout=0)
    assert len(left) == cpus - 1 and not any(ray.get(done))   # returned with exactly the gated ones left
    (tmp_path / "go").touch()
    assert sum(ray.get(reports)) == cpus - 1
