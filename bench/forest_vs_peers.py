"""orchard's forest vs LightGBM, XGBoost and scikit-learn forests on the same pixels and candidates.

    python bench/forest_vs_peers.py                      # both shapes (today's bench size, paper-like)
    python bench/forest_vs_peers.py --shape today        # 63,580 pixels x 3 trees x 100 offsets
    python bench/forest_vs_peers.py --shape paper        # 500,000 pixels x 2,000 offsets: needs ~12 GB RAM
    python bench/forest_vs_peers.py --shape today forest.max_depth=12   # hydra overrides follow

Every system learns from the same sampled training pixels and the same candidate offsets:
orchard's tree t searches tree t's pool of `n_offsets` offset pairs (x `n_thresholds`
thresholds) at every node, computing eq. 1 on the fly; the peers cannot, so they get the
precomputed (pixels x all trees' offsets) response matrix, built in their own process and
timed beside their training, and pick `max_features` = `n_offsets` candidates per node
(orchard's candidates per node) from it:
  LightGBM       one multiclass model, boosting_type="rf", feature_fraction_bynode
  XGBoost        XGBRFClassifier (num_parallel_tree, colsample_bynode), if installed
  scikit-learn   ExtraTreesClassifier and RandomForestClassifier, max_features=n_offsets
Same tree count and depth, bagging of ~image_fraction x pixel_fraction of the pixels, balanced
classes, all CPUs of the machine for each. Each system runs in a fresh process whose peak
memory (RSS of the process and its children, sampled at 20 Hz: Ray's workers included for
orchard) is reported. Accuracy: all body pixels of the held-out scenes.
Take the figures on an IDLE machine: the load average is printed beside every row.
Figures go to docs/benchmarks/forest.md.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    # the issue-20 measurement: 32 scenes x 2,000 pixels, 3 trees, depth 10, 100 offsets x 20 thresholds
    "today": ["forest.train_images=32", "forest.test_images=8", "forest.num_trees=3", "forest.max_depth=10",
              "forest.n_offsets=100", "forest.n_thresholds=20", "forest.preprocess.compose_prob=0.0"],
    # paper-like: 250 scenes x 2,000 pixels = 500k pixels, 2,000 offsets x 50 thresholds (2.3), one tree:
    # the peers' float32 matrix is 500k x 2,000 x 4 B = 4 GB
    "paper": ["forest.train_images=250", "forest.test_images=8", "forest.num_trees=1", "forest.max_depth=16",
              "forest.n_offsets=2000", "forest.n_thresholds=50", "forest.image_fraction=1.0",
              "forest.pixel_fraction=1.0", "forest.preprocess.compose_prob=0.0", "forest.memory_budget_mb=512",
              "forest.partitions_by_depth=[]"],
}


# ---------------------------------------------------------------------------- data
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
        split_blocks = []
        for b, i in enumerate(range(0, count, per)):
            ids = list(range(split * 10**6 + i, split * 10**6 + i + len(stems[i:i + per])))
            block = build_block(stems[i:i + per], ids, split * 10**6 + b, cfg["seed"], pal, f["preprocess"],
                                f["examples_per_image"], keep_labels=True)
            block.pop("skipped")
            split_blocks.append(block)
        blocks.append(split_blocks)
    return blocks


def save_blocks(path: Path, blocks: list[dict]) -> None:
    np.savez(path, n=np.array(len(blocks)), **{f"{i}/{k}": v for i, b in enumerate(blocks) for k, v in b.items()})


def load_blocks(path: Path) -> list[dict]:
    with np.load(path, allow_pickle=False) as z:
        out = [{} for _ in range(int(z["n"]))]
        for key in z.files:
            if key != "n":
                i, k = key.split("/", 1)
                out[int(i)][k] = z[key] if z[key].ndim else z[key].item()
    return out


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


def mean_class_accuracy(truth, predicted) -> tuple[float, float]:
    from workloads.forest.inference import accuracy_metrics, confusion_matrix
    acc = accuracy_metrics(confusion_matrix(truth, predicted.astype(np.uint8)))
    return acc["pixel_accuracy"], acc["mean_class_accuracy"]


# ---------------------------------------------------------------------------- one system per process
def peak_rss_sampler(stop: threading.Event, out: list) -> None:
    """Peak RSS (bytes) of this process and all its descendants (Ray's processes included)."""
    import psutil

    me, peak = psutil.Process(), 0
    while not stop.is_set():
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        peak = max(peak, total)
        time.sleep(0.05)
    out.append(peak)


def run_orchard(cfg, data_dir: Path, profile: bool) -> dict:
    import ray

    from workloads.forest.inference import pack_forest, predict_pixels
    from workloads.forest.rounds import RoundRunner
    from workloads.forest.train import initial_state, tree_pool

    f, seed, cpus = cfg["forest"], cfg["seed"], os.cpu_count()
    train_blocks, test_blocks = load_blocks(data_dir / "train.npz"), load_blocks(data_dir / "test.npz")
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
    refs = [ray.put(b) for b in train_blocks]
    del train_blocks
    strategy = {"num_workers": cpus, "cpus_per_worker": 1, "max_failures": 3}

    def fit(fc):
        rounds = []
        runner = RoundRunner(refs, fc, strategy, seed, data_dir / "ckpt.npz", on_round=lambda t, d, m: rounds.append(m))
        state = initial_state(dict(fc, resume=None), seed)
        start = time.perf_counter()
        for t in range(fc["num_trees"]):
            runner.train_tree(t, tree_pool(seed, t, fc), state)
        seconds = time.perf_counter() - start
        runner.shutdown()
        return state, seconds, rounds

    fit(dict(f, num_trees=1, max_depth=2))  # compile/load numba caches and start workers: not timed
    state, seconds, rounds = fit(f)
    ray.shutdown()
    te = stacked_examples(test_blocks, all_body_pixels=True)
    packed = pack_forest(state["trees"], state["class_weights"])
    pred = predict_pixels(te[0], te[1], te[2], te[3], packed["offsets"], packed["threshold"], packed["left"],
                          packed["right"], packed["dist"], packed["roots"], np.float32(f["background_mm"]))
    out = {"train_s": seconds, "matrix_s": 0.0, "acc": mean_class_accuracy(te[4], pred)}
    if profile:
        keys = ("phase1_s", "phase2_s", "phase3_s", "phase4_s", "total_s")
        out["profile"] = [{"tree": int(m["round/tree"]), "depth": int(m["round/depth"]),
                           "frontier": int(m["round/frontier_size"]), "batches": int(m["round/node_batches"]),
                           "parallelism": m["round/effective_parallelism"],
                           "shuffle_bytes": m["round/shuffle_bytes"], **{k: m[f"round/{k}"] for k in keys}}
                          for m in rounds]
    return out


def peer_model(name: str, f: dict, n_columns: int, seed: int, cpus: int):
    """The peer, configured like orchard: T trees, depth, n_offsets candidates per node."""
    per_node = f["n_offsets"]
    bag = f["image_fraction"] * f["pixel_fraction"]
    common_leaf = dict(min_samples_split=f["min_examples"], min_samples_leaf=f["min_child_examples"])
    if name == "LightGBM rf":
        from lightgbm import LGBMClassifier
        return LGBMClassifier(boosting_type="rf", objective="multiclass", n_estimators=f["num_trees"],
                              max_depth=f["max_depth"], num_leaves=min(2 ** f["max_depth"], 131072),
                              max_bin=f["n_thresholds"] + 1, bagging_fraction=min(bag, 0.999), bagging_freq=1,
                              feature_fraction_bynode=per_node / n_columns,
                              min_child_samples=f["min_child_examples"], class_weight="balanced",
                              n_jobs=cpus, verbose=-1, random_state=seed)
    if name == "XGBoost rf":
        from xgboost import XGBRFClassifier
        return XGBRFClassifier(n_estimators=f["num_trees"], max_depth=f["max_depth"], subsample=min(bag, 0.999),
                               colsample_bynode=per_node / n_columns, max_bin=f["n_thresholds"] + 1,
                               tree_method="hist", n_jobs=cpus, random_state=seed)
    if name == "sklearn ExtraTrees":
        from sklearn.ensemble import ExtraTreesClassifier
        return ExtraTreesClassifier(n_estimators=f["num_trees"], max_depth=f["max_depth"], max_features=per_node,
                                    bootstrap=True, max_samples=bag, class_weight="balanced", n_jobs=cpus,
                                    random_state=seed, **common_leaf)
    from sklearn.ensemble import RandomForestClassifier
    return RandomForestClassifier(n_estimators=f["num_trees"], max_depth=f["max_depth"], max_features=per_node,
                                  max_samples=bag, class_weight="balanced", n_jobs=cpus, random_state=seed,
                                  **common_leaf)


def run_peer(name: str, cfg, data_dir: Path) -> dict:
    from workloads.forest.features import feature_matrix
    from workloads.forest.train import tree_pool

    f, seed = cfg["forest"], cfg["seed"]
    offsets = np.concatenate([tree_pool(seed, t, f)[0] for t in range(f["num_trees"])])
    bg = np.float32(f["background_mm"])
    tr = stacked_examples(load_blocks(data_dir / "train.npz"), all_body_pixels=False)
    start = time.perf_counter()
    x_train = feature_matrix(tr[0], tr[1], tr[2], tr[3], offsets, bg)
    matrix_s = time.perf_counter() - start
    model = peer_model(name, f, len(offsets), seed, os.cpu_count())
    start = time.perf_counter()
    if name == "XGBoost rf":  # XGBoost takes no class_weight: balanced sample weights instead
        from sklearn.utils.class_weight import compute_sample_weight
        model.fit(x_train, tr[4], sample_weight=compute_sample_weight("balanced", tr[4]))
    else:
        model.fit(x_train, tr[4])
    train_s = time.perf_counter() - start
    del x_train
    te = stacked_examples(load_blocks(data_dir / "test.npz"), all_body_pixels=True)
    classes = np.unique(tr[4])
    predicted = model.predict(feature_matrix(te[0], te[1], te[2], te[3], offsets, bg))
    if name == "XGBoost rf":
        predicted = classes[predicted]
    return {"train_s": train_s, "matrix_s": matrix_s, "acc": mean_class_accuracy(te[4], np.asarray(predicted))}


def _child(name, cfg, data_dir, profile, queue):
    stop, peak = threading.Event(), []
    sampler = threading.Thread(target=peak_rss_sampler, args=(stop, peak), daemon=True)
    sampler.start()
    try:
        out = run_orchard(cfg, data_dir, profile) if name == "orchard" else run_peer(name, cfg, data_dir)
    except ImportError as exc:
        out = {"error": f"not installed ({exc.name})"}
    except Exception as exc:  # noqa: BLE001 - a peer that fails is a row, not the end of the bench
        out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    stop.set()
    sampler.join()
    queue.put({**out, "peak_bytes": peak[0] if peak else 0})


def measure(name: str, cfg, data_dir: Path, profile: bool = False) -> dict:
    """Run one system in a fresh process; its result with the load average around it."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    load_before = os.getloadavg()[0]
    proc = ctx.Process(target=_child, args=(name, cfg, data_dir, profile, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return {**out, "load": (load_before, os.getloadavg()[0])}


# ---------------------------------------------------------------------------- the table
SYSTEMS = ("orchard", "LightGBM rf", "XGBoost rf", "sklearn ExtraTrees", "sklearn RF")


def bench_shape(shape: str, overrides: list[str], profile: bool, systems=SYSTEMS) -> list[tuple[str, dict]]:
    from orchard.config import compose

    cfg = compose(["workload=forest", *SHAPES[shape], *overrides])
    f = cfg["forest"]
    data_dir = Path(tempfile.mkdtemp(prefix=f"forest_bench_{shape}_"))
    train_blocks, test_blocks = corpus(cfg, data_dir)
    save_blocks(data_dir / "train.npz", train_blocks)
    save_blocks(data_dir / "test.npz", test_blocks)
    pixels = sum(len(b["ex_img"]) for b in train_blocks)
    test_pixels = int(sum(((b["labels"] < 31) & (b["depths"] > 0)).sum() for b in test_blocks))
    del train_blocks, test_blocks
    print(f"\n== shape '{shape}': {pixels:,} training pixels ({f['train_images']} scenes), {test_pixels:,} test "
          f"pixels; {f['num_trees']} trees x {f['n_offsets']} offsets x {f['n_thresholds']} thresholds per node, "
          f"depth {f['max_depth']}; peers' matrix {pixels:,} x {f['num_trees'] * f['n_offsets']} float32 = "
          f"{pixels * f['num_trees'] * f['n_offsets'] * 4 / 2**30:.2f} GiB; {os.cpu_count()} CPUs", flush=True)
    rows = []
    for name in systems:
        result = measure(name, cfg, data_dir, profile)
        rows.append((name, result))
        print(f"   {name}: {json.dumps({k: v for k, v in result.items() if k != 'profile'}, default=float)}", flush=True)
    print_table(shape, rows)
    orchard = dict(rows)["orchard"]
    if profile and "profile" in orchard:
        print_profile(orchard["profile"])
    return rows


def print_table(shape: str, rows) -> None:
    results = dict(rows)
    lgbm = results.get("LightGBM rf", {})
    print(f"\n{'system':<20}{'train s':>9}{'matrix s':>10}{'total s':>9}{'peak GiB':>10}{'pixel acc':>11}"
          f"{'class acc':>11}{'total vs LightGBM':>19}{'load before/after':>19}")
    for name, r in rows:
        if "error" in r:
            print(f"{name:<20}  {r['error']}")
            continue
        total = r["train_s"] + r["matrix_s"]
        vs = f"{total / (lgbm['train_s'] + lgbm['matrix_s']):.2f}x" if "train_s" in lgbm else "-"
        print(f"{name:<20}{r['train_s']:>9.1f}{r['matrix_s']:>10.1f}{total:>9.1f}{r['peak_bytes'] / 2**30:>10.2f}"
              f"{r['acc'][0]:>11.3f}{r['acc'][1]:>11.3f}{vs:>19}{r['load'][0]:>10.1f}/{r['load'][1]:.1f}")
    o = results.get("orchard", {})
    if "train_s" in o and "train_s" in lgbm:
        if shape == "today":
            ok = o["train_s"] <= 1.5 * lgbm["train_s"] and o["acc"][1] >= lgbm["acc"][1]
            print(f"target (today): orchard train <= 1.5x LightGBM train ({o['train_s'] / lgbm['train_s']:.2f}x) "
                  f"at no lower mean class accuracy ({o['acc'][1]:.3f} vs {lgbm['acc'][1]:.3f}): "
                  f"{'MET' if ok else 'not met'}")
        else:
            ok = (o["train_s"] < lgbm["train_s"] + lgbm["matrix_s"]
                  and o["peak_bytes"] < lgbm["peak_bytes"] / 4)
            print(f"target (paper): orchard faster than LightGBM + matrix ({o['train_s']:.1f} vs "
                  f"{lgbm['train_s'] + lgbm['matrix_s']:.1f} s) with < 1/4 of its peak memory "
                  f"({o['peak_bytes'] / 2**30:.2f} vs {lgbm['peak_bytes'] / 2**30:.2f} GiB): {'MET' if ok else 'not met'}")
    print("(valid only if the load average stayed near 0: figures from a loaded machine are not results)")


def print_profile(rounds: list[dict]) -> None:
    """Where orchard's time goes, summed over trees per depth."""
    print(f"\n{'depth':>5}{'frontier':>9}{'batches':>8}{'phase1':>8}{'phase2':>8}{'phase3':>8}{'phase4':>8}"
          f"{'total':>8}{'par.':>6}{'shuffle MB':>11}")
    for depth in sorted({r["depth"] for r in rounds}):
        rs = [r for r in rounds if r["depth"] == depth]
        s = lambda k: sum(r[k] for r in rs)  # noqa: E731
        print(f"{depth:>5}{s('frontier'):>9}{s('batches'):>8}{s('phase1_s'):>8.2f}{s('phase2_s'):>8.2f}"
              f"{s('phase3_s'):>8.2f}{s('phase4_s'):>8.2f}{s('total_s'):>8.2f}"
              f"{np.mean([r['parallelism'] for r in rs]):>6.2f}{s('shuffle_bytes') / 1e6:>11.2f}")
    tot = {k: sum(r[k] for r in rounds) for k in ("phase1_s", "phase2_s", "phase3_s", "phase4_s", "total_s")}
    print("share of round time: " + ", ".join(f"{k[:-2]} {v / tot['total_s']:.0%}" for k, v in tot.items()
                                              if k != "total_s"))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["today", "paper", "both"], default="both")
    parser.add_argument("--profile", action="store_true", help="print orchard's time per phase and depth")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}")
    args, overrides = parser.parse_known_args(argv)
    print(f"load average at start: {os.getloadavg()} ({os.cpu_count()} CPUs)")
    for shape in (["today", "paper"] if args.shape == "both" else [args.shape]):
        bench_shape(shape, overrides, args.profile, [s.strip() for s in args.systems.split(",")])


if __name__ == "__main__":
    main(sys.argv[1:])
