"""orchard's forest vs scikit-learn RandomForest and LightGBM (rf mode) on the same pixels.

    python bench/forest_vs_peers.py [hydra overrides, e.g. forest.max_depth=12]

All three learn from the same sampled training pixels and the same candidate features
(tree 0's pool of offset pairs): orchard computes eq. 1 on the fly inside its kernels;
the peers cannot, so the (examples x offsets) response matrix is precomputed for them
and that precomputation is timed and reported. Equal depth and tree count; classes
balanced in all three (orchard: inverse priors; peers: class_weight="balanced").
Also printed: the histogram kernel's example-features/s on 2 threads, and the 1 -> 2
worker speed-up of orchard's rounds. Figures go to docs/benchmarks/forest.md.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCH_DEFAULTS = ["forest.train_images=32", "forest.test_images=8", "forest.num_trees=3",
                  "forest.max_depth=10", "forest.n_offsets=100", "forest.n_thresholds=20",
                  "forest.preprocess.compose_prob=0.0"]


def corpus(cfg, folder: Path):
    """Train and test blocks built by the workload's own renderer, PNG writer and loader."""
    from workloads.forest.avatar import render_avatar_image
    from workloads.forest.data_unit import build_block
    from workloads.forest.depth_png import palette_array, write_pair

    f = cfg["forest"]
    pal = palette_array(f["palette"])
    blocks = []
    for split, count in ((0, f["train_images"]), (1, f["test_images"])):
        stems = []
        for i in range(count):
            d, lab = render_avatar_image([cfg["seed"], split, i], f["image_height"], f["image_width"])
            write_pair(folder / f"{split}_{i:05d}", d, lab, pal)
            stems.append(str(folder / f"{split}_{i:05d}"))
        per = f["images_per_block"]
        blocks.append([build_block(stems[i:i + per], list(range(split * 10**6 + i, split * 10**6 + i + len(stems[i:i + per]))),
                                   split * 10**6 + b, cfg["seed"], pal, f["preprocess"],
                                   f["examples_per_image"], keep_labels=True)
                       for b, i in enumerate(range(0, count, per))])
    return blocks


def stacked_examples(blocks, all_body_pixels: bool):
    """depths (n, H, W), and example arrays (img, y, x, cls) over all blocks."""
    depths = np.concatenate([b["depths"] for b in blocks])
    if all_body_pixels:
        labels = np.concatenate([b["labels"] for b in blocks])
        img, ys, xs = (a.astype(np.int32) for a in np.nonzero((labels < 31) & (depths > 0)))
        return depths, img, ys, xs, labels[img, ys, xs]
    base = np.cumsum([0] + [len(b["depths"]) for b in blocks])[:-1]
    cat = lambda k: np.concatenate([b[k] for b in blocks])  # noqa: E731
    img = np.concatenate([b["ex_img"] + o for b, o in zip(blocks, base)]).astype(np.int32)
    return depths, img, cat("ex_y"), cat("ex_x"), cat("ex_cls")


def accuracy(truth, predicted):
    from workloads.forest.inference import accuracy_metrics, confusion_matrix
    return accuracy_metrics(confusion_matrix(truth, predicted))


def train_orchard(refs, f, workers, seed, tmp, pool):
    """Train f['num_trees'] trees (each on its own image/pixel subset) from one feature pool."""
    from workloads.forest.rounds import RoundRunner
    from workloads.forest.train import initial_state

    rounds = []
    runner = RoundRunner(refs, f, {"num_workers": workers, "cpus_per_worker": 1, "max_failures": 3},
                         seed, Path(tmp) / f"ckpt{workers}.npz", on_round=lambda t, d, m: rounds.append(m))
    state = initial_state(dict(f, resume=None), seed)
    start = time.perf_counter()
    for t in range(f["num_trees"]):
        runner.train_tree(t, pool, state)
    seconds = time.perf_counter() - start
    runner.shutdown()
    return state, seconds, rounds


def kernel_rate(depths, img, ys, xs, cls, offsets, thresholds, threads):
    """Example-features/s of the phase-2 kernel (64 node slots), wall and per CPU-second."""
    import numba

    from workloads.forest.histogram_kernels import accumulate_histograms

    numba.set_num_threads(threads)
    # 64 nodes x every class as compact columns, examples grouped by column as in phase 2
    columns = ((np.arange(len(img)) * 64 // len(img)) * 31 + cls).astype(np.int32)
    order = np.argsort(columns, kind="stable")
    img, ys, xs, columns = img[order], ys[order], xs[order], columns[order]
    hist = np.zeros((64 * 31, len(offsets), thresholds.shape[1] + 1), np.int32)
    accumulate_histograms(hist, depths, img[:50], ys[:50], xs[:50], columns[:50], offsets, thresholds, 10000.0)
    wall, cpu = time.perf_counter(), time.process_time()
    accumulate_histograms(hist, depths, img, ys, xs, columns, offsets, thresholds, 10000.0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    work = len(img) * len(offsets)
    return work / wall, work / cpu


def main(overrides: list[str]) -> None:
    import ray
    from lightgbm import LGBMClassifier
    from sklearn.ensemble import RandomForestClassifier

    from orchard.config import compose
    from workloads.forest.features import feature_matrix
    from workloads.forest.inference import pack_forest, predict_pixels
    from workloads.forest.train import tree_pool

    cfg = compose(["workload=forest", *BENCH_DEFAULTS, *overrides])
    f, seed = cfg["forest"], cfg["seed"]
    tmp = tempfile.mkdtemp(prefix="forest_bench_")
    train_blocks, test_blocks = corpus(cfg, Path(tmp))
    tr = stacked_examples(train_blocks, all_body_pixels=False)
    te = stacked_examples(test_blocks, all_body_pixels=True)
    offsets, thresholds = tree_pool(seed, 0, f)
    print(f"data: {len(tr[1]):,} training pixels from {f['train_images']} images, {len(te[1]):,} test "
          f"pixels; {len(offsets)} offsets x {f['n_thresholds']} thresholds; {f['num_trees']} trees, "
          f"depth {f['max_depth']}; {os.cpu_count()} CPUs")

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        refs = [ray.put(b) for b in train_blocks]
        # one pool for every tree, since the peers get one matrix; trees differ by their
        # random image/pixel subsets (forest.image_fraction, pixel_fraction), like bagging
        f1 = dict(f, partitions={"data_units": 4, "features": 2, "nodes": 2}, partitions_by_depth=[])
        pool = (offsets, thresholds)
        train_orchard(refs, dict(f1, num_trees=1, max_depth=2), 2, seed, tmp, pool)  # warm numba caches
        state, t_orchard2, rounds = train_orchard(refs, f1, 2, seed, tmp, pool)
        _, t_orchard1, _ = train_orchard(refs, f1, 1, seed, tmp, pool)
    finally:
        ray.shutdown()
    packed = pack_forest(state["trees"], state["class_weights"])
    pred = predict_pixels(te[0], te[1], te[2], te[3], packed["offsets"], packed["threshold"], packed["left"],
                          packed["right"], packed["dist"], packed["roots"], np.float32(f["background_mm"]))
    results = {"orchard": (t_orchard2, 0.0, accuracy(te[4], pred))}

    start = time.perf_counter()
    x_train = feature_matrix(tr[0], tr[1], tr[2], tr[3], offsets, np.float32(f["background_mm"]))
    t_matrix = time.perf_counter() - start
    x_test = feature_matrix(te[0], te[1], te[2], te[3], offsets, np.float32(f["background_mm"]))
    peers = {
        "sklearn RF": RandomForestClassifier(n_estimators=f["num_trees"], max_depth=f["max_depth"],
                                             max_features=None, min_samples_split=f["min_examples"],
                                             min_samples_leaf=f["min_child_examples"], n_jobs=2,
                                             class_weight="balanced", random_state=seed),
        "LightGBM rf": LGBMClassifier(boosting_type="rf", n_estimators=f["num_trees"], max_depth=f["max_depth"],
                                      num_leaves=min(2 ** f["max_depth"], 131072), max_bin=f["n_thresholds"] + 1,
                                      bagging_fraction=0.8, bagging_freq=1, feature_fraction=1.0,
                                      min_child_samples=f["min_child_examples"], class_weight="balanced",
                                      n_jobs=2, verbose=-1, random_state=seed),
    }
    for name, model in peers.items():
        start = time.perf_counter()
        model.fit(x_train, tr[4])
        seconds = time.perf_counter() - start
        results[name] = (seconds, t_matrix, accuracy(te[4], model.predict(x_test).astype(np.uint8)))

    print(f"\n{'system':<14}{'train s':>10}{'+matrix s':>11}{'pixel acc':>11}{'class acc':>11}{'orchard faster by':>19}")
    for name, (seconds, matrix, acc) in results.items():
        ratio = (seconds + matrix) / t_orchard2
        print(f"{name:<14}{seconds:>10.1f}{matrix:>11.1f}{acc['pixel_accuracy']:>11.3f}"
              f"{acc['mean_class_accuracy']:>11.3f}{ratio:>18.2f}x")
    wall1, cpu1 = kernel_rate(*tr, offsets, thresholds, 1)
    wall2, cpu2 = kernel_rate(*tr, offsets, thresholds, 2)
    print(f"\nkernel: {wall2 / 1e6:.1f} M example-features/s on 2 threads ({wall1 / 1e6:.1f} M on 1); "
          f"per CPU-second {cpu2 / 1e6:.1f} M (2 threads), {cpu1 / 1e6:.1f} M (1)")
    print(f"orchard rounds: 1 worker {t_orchard1:.1f} s, 2 workers {t_orchard2:.1f} s: "
          f"speed-up {t_orchard1 / t_orchard2:.2f}x; mean effective parallelism "
          f"{np.mean([m['round/effective_parallelism'] for m in rounds]):.2f}")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} (2 cores)")


if __name__ == "__main__":
    main(sys.argv[1:])
