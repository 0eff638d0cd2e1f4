"""orchard's forest vs LightGBM, XGBoost and scikit-learn forests on the same pixels and candidates.

    python -m bench forest           # the 'today' shape: ~8 min on 2 idle cores (3 repeats)
    python -m bench forest_mid       # 150,000 pixels x 1,000 offsets, depth 14: issue 34's deciding shape (3 repeats)
    python -m bench forest_paper --repeats 1   # 500,000 pixels x 2,000 offsets: ~17 GB RAM (LightGBM's peak), ~12 min a repeat
    python -m bench forest_beyond --repeats 1  # 3.4M pixels x 2,000 offsets: the peers' matrix does not fit in memory

What is compared: the time to train a random forest of body-part classifiers on depth pixels,
and the accuracy on every body pixel of held-out scenes (pixel accuracy, mean per-class accuracy).
Why it is fair:
- the same data: every system learns from the same sampled training pixels (rendered once by the
  workload's own renderer, PNG writer and loader) and the same candidate depth-comparison offsets.
  orchard computes eq. 1 on the fly for tree t's pool of `n_offsets` offsets; the peers cannot, so
  they get the (pixels x all trees' offsets) response matrix, built in their own process and timed
  as part of their work (peer time = matrix + training; both are in the row's quality).
- the same model size: tree count, depth, bagging of image_fraction x pixel_fraction of the
  pixels, balanced classes.
- the same threads: each system in a fresh process with all CPUs of the machine (orchard: one Ray
  worker per CPU; peers: n_jobs = CPUs); systems alternate within each repeat.
- each peer configured as its own docs recommend for a random forest:
    LightGBM        ONE multiclass model with boosting_type="rf" (bagging_fraction < 1 with
                    bagging_freq=1, feature_fraction_bynode = orchard's candidates per node), not
                    one forest per class;
    XGBoost         XGBRFClassifier (num_parallel_tree, subsample and colsample_bynode < 1,
                    tree_method="hist"), if installed (`pip install -e ".[bench]"`);
    scikit-learn    ExtraTreesClassifier and RandomForestClassifier with max_features = orchard's
                    candidates per node (n_offsets columns drawn per node), as issue 20 asks, not
                    their default sqrt(columns), which would search fewer candidates than orchard.
- orchard's numba kernels are compiled and its Ray workers started by an untimed one-tree warm-up;
  the peers' libraries are imported before their timer starts.
Full mode also times orchard with 1 worker against 2 (the 1 -> 2 worker speed-up), the same 2
workers on a two-node ray.cluster_utils.Cluster (a CPU each; the paper's effective parallelism on
one node and on two), and orchard
without histogram subtraction (forest.histogram_subtraction=false: the same trees, every example
counted) and without the bin cache (forest.bin_cache_mb=0: the same trees, eq. 1 evaluated on the
fly every round), the "before" of each change. Each shape's last row is issue 34's: orchard against
the fastest peer whose mean per-class accuracy is within 0.01 of orchard's or above it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# orchard's partitioning at the big shapes, on one machine: one data partition, the features split
# in two (a task per worker), 2 histogram actors throughout (4 would hold twice the histogram memory
# the bench compares). With the bin cache a task's counting is cheap, and every further data
# partition only adds a partial histogram to allocate, encode, ship and sum: at the mid shape,
# 2026-11-26 17:02 (load average 2.4-2.9, falling), 12.9-13.4 s against 16.2-16.8 s with the
# workload's default (4 data partitions, 2 from depth 10), the same tree.
ONE_MACHINE = ["forest.partitions.data_units=1", "forest.partitions.features=2", "forest.partitions.nodes=2",
               "forest.partitions_by_depth=[]"]
SHAPES = {
    # the issue-20 measurement: 32 scenes x 2,000 pixels, 3 trees, depth 10, 100 offsets x 20 thresholds
    "today": ["forest.train_images=32", "forest.test_images=8", "forest.num_trees=3", "forest.max_depth=10",
              "forest.n_offsets=100", "forest.n_thresholds=20", "forest.preprocess.compose_prob=0.0"],
    # paper-like: 250 scenes x 2,000 pixels = 500k pixels, 2,000 offsets x 50 thresholds (2.3), one tree:
    # the peers' float32 matrix is 500k x 2,000 x 4 B = 4 GB
    "paper": ["forest.train_images=250", "forest.test_images=8", "forest.num_trees=1", "forest.max_depth=16",
              "forest.n_offsets=2000", "forest.n_thresholds=50", "forest.image_fraction=1.0",
              "forest.pixel_fraction=1.0", "forest.preprocess.compose_prob=0.0", "forest.memory_budget_mb=512",
              *ONE_MACHINE],
    # issue 34's deciding shape: 3 repeats of every system in under an hour, with the paper shape's
    # settings (one tree, 50 thresholds, all pixels; the peers' matrix 150k x 1,000 x 4 B = 0.6 GB)
    "mid": ["forest.train_images=75", "forest.test_images=8", "forest.num_trees=1", "forest.max_depth=14",
            "forest.n_offsets=1000", "forest.n_thresholds=50", "forest.image_fraction=1.0",
            "forest.pixel_fraction=1.0", "forest.preprocess.compose_prob=0.0", "forest.memory_budget_mb=512",
            *ONE_MACHINE],
    # issue 34, Must-have 3: the seed's regime, data whose feature matrix outgrows the machine:
    # 1,700 scenes x ~2,000 pixels = 3.4M pixels x 2,000 offsets, 25 GiB as the peers' float32
    # matrix on a 23.5 GiB machine (1,500 scenes' 22.3 GiB would still be under its total). orchard
    # evaluates eq. 1 on the fly for what its bin cache (3 GiB of the 6.3 GiB of bins) does not
    # hold; its histograms keep to memory_budget_mb. Depth 14 (the mid
    # shape's): below it a 512 MB budget splits each round into tens of node batches, each a pass
    # over the 3M pixels, and one repeat would take over an hour.
    "beyond": ["forest.train_images=1700", "forest.test_images=8", "forest.num_trees=1", "forest.max_depth=14",
               "forest.n_offsets=2000", "forest.n_thresholds=50", "forest.image_fraction=1.0",
               "forest.pixel_fraction=1.0", "forest.preprocess.compose_prob=0.0", "forest.memory_budget_mb=512",
               "forest.bin_cache_mb=3072", *ONE_MACHINE],
}


# ---------------------------------------------------------------------------- data
def _render_pair(seed, split, i, f, stem):
    from workloads.forest.avatar import render_avatar_image
    from workloads.forest.depth_png import palette_array, write_pair

    d, lab = render_avatar_image([seed, split, i], f["image_height"], f["image_width"])
    write_pair(stem, d, lab, palette_array(f["palette"]))


def _block(stems, ids, block_id, seed, f):
    from workloads.forest.data_unit import build_block
    from workloads.forest.depth_png import palette_array

    block = build_block(stems, ids, block_id, seed, palette_array(f["palette"]), f["preprocess"],
                        f["examples_per_image"], keep_labels=True)
    block.pop("skipped")
    return block


def corpus(cfg, folder: Path):
    """Train and test blocks built by the workload's own renderer, PNG writer and loader, on all
    CPUs (the beyond-memory shape renders 1,700 scenes); the same blocks however many CPUs."""
    from concurrent.futures import ProcessPoolExecutor

    f, seed = dict(cfg["forest"]), cfg["seed"]
    blocks = []
    with ProcessPoolExecutor(os.cpu_count(), mp_context=mp.get_context("spawn")) as pool:
        for split, count in ((0, f["train_images"]), (1, f["test_images"])):
            stems = [str(folder / f"{split}_{i:05d}") for i in range(count)]
            list(pool.map(_render_pair, [seed] * count, [split] * count, range(count), [f] * count, stems,
                          chunksize=8))
            per = f["images_per_block"]
            starts = list(range(0, count, per))
            blocks.append(list(pool.map(_block, [stems[i:i + per] for i in starts],
                                        [list(range(split * 10**6 + i, split * 10**6 + i + len(stems[i:i + per])))
                                         for i in starts],
                                        [split * 10**6 + b for b in range(len(starts))], [seed] * len(starts),
                                        [f] * len(starts))))
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
    cat = lambda k: np.concatenate([b[k] for b in blocks])  
    img = np.concatenate([b["ex_img"] + o for b, o in zip(blocks, base)]).astype(np.int32)
    return depths, img, cat("ex_y"), cat("ex_x"), cat("ex_cls")


def mean_class_accuracy(truth, predicted) -> tuple[float, float]:
    from workloads.forest.evaluate import accuracy_metrics, confusion_matrix
    acc = accuracy_metrics(confusion_matrix(truth, predicted.astype(np.uint8)))
    return acc["pixel_accuracy"], acc["mean_class_accuracy"]


# ---------------------------------------------------------------------------- one system per process
class PeakMemory:
    """Peak memory (bytes) of process ``pid`` and all its descendants (Ray's processes included),
    sampled every 0.1 s: RSS and PSS summed over the tree. RSS counts a shared page in every process
    that maps it (Ray's object store is shared memory, mapped by the driver and every worker), PSS
    divides it among them: PSS is the fair sum for orchard; for the single-process peers the two
    agree. Run by the bench's own process, so the peak is known even for a system the kernel killed."""

    def __init__(self, pid: int):
        import psutil

        from orchard import background

        self.rss = self.pss = 0
        try:
            self.root = psutil.Process(pid)
        except psutil.Error:
            self.root = None
        self._poller = background.Poller(self._sample, 0.1, "bench-peak-memory", at_once=True)

    def __enter__(self) -> "PeakMemory":
        if self.root is not None:
            self._poller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._poller.stop(timeout_s=10)

    def _sample(self) -> None:
        import psutil

        rss = pss = 0
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                full = p.memory_full_info()
                rss, pss = rss + full.rss, pss + full.pss
            except psutil.Error:
                pass
        self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)


def start_two_nodes(cpus: int):
    """A two-node ``ray.cluster_utils.Cluster`` on this machine, the CPUs and the object store of
    one node split between the nodes: the same cores and memory as one node, with every partial
    histogram that a task on the other node sends, and each data unit's one fetch to its home
    node (workloads/forest/locality.py), crossing between two object stores. Returns the cluster
    (to shut down). The store is split explicitly: ``cluster_utils`` gives each node 150 MiB
    unless told, against the 30% of memory of ``ray.init`` on one node, and at the mid shape the
    bin cache (150 MB) alone then spilled to disk every round (docs/scaling.md, forest)."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from bench.machine import as_an_operator_would

    as_an_operator_would()  # the nodes start as docs/cluster.md asks an operator to start them
    store = int(psutil.virtual_memory().available * 0.3)  # ray.init's default on one node
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus // 2, "object_store_memory": store // 2})
    cluster.add_node(num_cpus=cpus - cpus // 2, object_store_memory=store // 2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    return cluster


def run_orchard(cfg, data_dir: Path, profile: bool, workers: int | None = None, two_nodes: bool = False) -> dict:
    import ray

    from bench.machine import start_ray
    from orchard.cluster import idle_worker_config
    from workloads.forest.checkpoint import initial_state
    from workloads.forest.model import pack_forest, predict_pixels
    from workloads.forest.train import RoundRunner, tree_pool

    f, seed, cpus = cfg["forest"], cfg["seed"], os.cpu_count()
    train_blocks, test_blocks = load_blocks(data_dir / "train.npz"), load_blocks(data_dir / "test.npz")
    # one node: orchard's side on the Ray `python -m orchard` embeds (idle workers kept a minute)
    cluster = start_two_nodes(cpus) if two_nodes else start_ray(num_cpus=cpus, _system_config=idle_worker_config())
    refs = [ray.put(b) for b in train_blocks]
    del train_blocks
    strategy = {"num_workers": workers or cpus, "cpus_per_worker": 1, "max_failures": 3}

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
    nodes = len({n["NodeID"] for n in ray.nodes() if n["Alive"]})
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
    te = stacked_examples(test_blocks, all_body_pixels=True)
    packed = pack_forest(state["trees"], state["class_weights"])
    pred = predict_pixels(te[0], te[1], te[2], te[3], packed["offsets"], packed["threshold"], packed["left"],
                          packed["right"], packed["dist"], packed["roots"], np.float32(f["background_mm"]))
    out = {"train_s": seconds, "matrix_s": 0.0, "acc": mean_class_accuracy(te[4], pred),
           "parallelism": effective_parallelism(rounds), "nodes": nodes}
    if profile:
        keys = ("bin_cache_s", "phase1_s", "phase2_s", "phase3_s", "phase4_s", "total_s")
        out["profile"] = [{"tree": int(m["round/tree"]), "depth": int(m["round/depth"]),
                           "frontier": int(m["round/frontier_size"]), "batches": int(m["round/node_batches"]),
                           "parallelism": m["round/effective_parallelism"],
                           "shuffle_bytes": m["round/shuffle_bytes"], **{k: m[f"round/{k}"] for k in keys},
                           # locality (workloads/forest/locality.py): data-unit bytes read across nodes
                           **{k: m.get(f"round/{k}", 0) for k in ("unit_bytes_across_nodes", "task_nodes")}}
                          for m in rounds]
    return out


def effective_parallelism(rounds: list[dict]) -> dict:
    """The paper's figure of merit over the whole run (task and actor busy time / wall time, each
    round weighted by its time), and the same for phase 1 and for phases 2-3."""
    def weighted(key: str, seconds) -> float:
        total = sum(seconds(m) for m in rounds)
        return sum(m[key] * seconds(m) for m in rounds) / total if total else 0.0

    return {"run": weighted("round/effective_parallelism", lambda m: m["round/total_s"]),
            "phase 1": weighted("round/phase1_parallelism", lambda m: m["round/phase1_s"]),
            "phases 2-3": weighted("round/phase23_parallelism", lambda m: m["round/phase2_s"] + m["round/phase3_s"])}


def lightgbm_pool_mb(matrix_bytes: int) -> int:
    """LightGBM's ``histogram_pool_size`` (MB). Unbounded (its default), its cache of per-leaf
    histograms grows to leaves x features x bins: at the paper shape (up to 65,536 leaves x 2,000
    offsets x 51 bins) the kernel killed it at 23 GiB. Its FAQ's answer to running out of RAM:
    set ``histogram_pool_size`` so that it plus the dataset fits, here half the machine's memory.
    At today's shape the histograms never reach the bound."""
    import psutil

    return max(1024, int((psutil.virtual_memory().total / 2 - matrix_bytes) / 2**20))


def peer_model(name: str, f: dict, n_columns: int, seed: int, cpus: int, matrix_bytes: int = 0):
    """The peer with orchard's trees, depth, bagging and class balance, searching orchard's
    n_offsets candidates per node."""
    per_node = f["n_offsets"]
    bag = f["image_fraction"] * f["pixel_fraction"]
    common_leaf = {"min_samples_split": f["min_examples"], "min_samples_leaf": f["min_child_examples"]}
    if name == "LightGBM rf":
        from lightgbm import LGBMClassifier
        return LGBMClassifier(boosting_type="rf", objective="multiclass", n_estimators=f["num_trees"],
                              max_depth=f["max_depth"], num_leaves=min(2 ** f["max_depth"], 131072),
                              max_bin=f["n_thresholds"] + 1, bagging_fraction=min(bag, 0.999), bagging_freq=1,
                              feature_fraction_bynode=per_node / n_columns,
                              min_child_samples=f["min_child_examples"], class_weight="balanced",
                              histogram_pool_size=lightgbm_pool_mb(matrix_bytes),
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
    feature_matrix(tr[0], tr[1][:8], tr[2][:8], tr[3][:8], offsets, bg)  # numba compile/cache load: untimed
    start = time.perf_counter()
    x_train = feature_matrix(tr[0], tr[1], tr[2], tr[3], offsets, bg)
    matrix_s = time.perf_counter() - start
    model = peer_model(name, f, len(offsets), seed, os.cpu_count(), x_train.nbytes)
    from sklearn.utils.class_weight import compute_sample_weight

    classes = np.unique(tr[4])
    start = time.perf_counter()
    if name == "XGBoost rf":  # XGBoost wants labels 0..K-1 and takes balanced sample weights, not class_weight
        model.fit(x_train, np.searchsorted(classes, tr[4]), sample_weight=compute_sample_weight("balanced", tr[4]))
    else:
        model.fit(x_train, tr[4])
    train_s = time.perf_counter() - start
    del x_train
    te = stacked_examples(load_blocks(data_dir / "test.npz"), all_body_pixels=True)
    predicted = model.predict(feature_matrix(te[0], te[1], te[2], te[3], offsets, bg))
    if name == "XGBoost rf":
        predicted = classes[predicted]
    return {"train_s": train_s, "matrix_s": matrix_s, "acc": mean_class_accuracy(te[4], np.asarray(predicted))}


def _child(name, cfg, data_dir, profile, queue):
    try:
        if name.startswith("orchard"):  # "orchard@1": one worker, for the 1 -> 2 worker speed-up
            if name in VARIANTS:  # a change switched off: its "before"
                cfg = {**cfg, "forest": {**cfg["forest"], **VARIANTS[name]["forest"]}}
            out = run_orchard(cfg, data_dir, profile, int(name.split("@")[1]) if "@" in name else None,
                              two_nodes=name == TWO_NODES)
        else:
            out = run_peer(name, cfg, data_dir)
    except ImportError as exc:
        out = {"error": f"not installed ({exc.name})"}
    except Exception as exc:  # noqa: BLE001 - a peer that fails is a row, not the end of the bench
        out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    queue.put(out)


def _died(exitcode: int | None, peak_bytes: int) -> str:
    """Why a system's process ended without a result (e.g. the kernel's out-of-memory killer)."""
    import psutil

    total = psutil.virtual_memory().total
    how = f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exited {exitcode}"
    oom = " (out of memory on this machine, most likely)" if peak_bytes > 0.8 * total else ""
    return f"{how} at a peak of {peak_bytes / 2**30:.1f} of {total / 2**30:.0f} GiB{oom}"


def measure_one(name: str, cfg, data_dir: Path, profile: bool = False, limit_s: float | None = None) -> dict:
    """Run one system in a fresh process; its result with its peak memory and the load average
    around it. A process that dies without a result (killed for memory), or is still running
    after ``limit_s``, is a failed row (``stopped_after_s`` for the latter), not a bench that
    waits forever."""
    import queue as queues

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    load_before = os.getloadavg()[0]
    proc = ctx.Process(target=_child, args=(name, cfg, data_dir, profile, results))
    proc.start()
    out, started = None, time.perf_counter()
    with PeakMemory(proc.pid) as peak:
        while out is None:
            try:
                out = results.get(timeout=1.0)
            except queues.Empty:
                if not proc.is_alive():
                    proc.join()
                    out = {"error": "died"}
                elif limit_s is not None and time.perf_counter() - started > limit_s:
                    proc.kill()
                    proc.join()
                    out = {"error": f"stopped: still training after {limit_s / 60:.0f} min", "stopped_after_s": limit_s}
        proc.join()
    peak_rss, peak_pss = peak.rss, peak.pss
    if out.get("error") == "died":
        out["error"] = _died(proc.exitcode, peak_rss)
    return {**out, "peak_bytes": peak_rss, "peak_pss_bytes": peak_pss, "load": (load_before, os.getloadavg()[0])}


# ---------------------------------------------------------------------------- the rows
PEERS = ("LightGBM rf", "XGBoost rf", "sklearn ExtraTrees", "sklearn RF")
# orchard with one of its changes switched off (the same trees): that change's "before"
VARIANTS = {"orchard-nosub": {"forest": {"histogram_subtraction": False}, "change": "histogram subtraction",
                              "label": "every example counted (forest.histogram_subtraction=false)"},
            "orchard-nocache": {"forest": {"bin_cache_mb": 0}, "change": "the bin cache",
                                "label": "eq. 1 on the fly every round (forest.bin_cache_mb=0)"}}
TWO_NODES = "orchard-2nodes"  # the same workers on a two-node ray.cluster_utils.Cluster (start_two_nodes)
FASTEST_WITHIN = 0.01  # issue 34: a peer counts when its class accuracy is within this of orchard's, or above
PACKAGE = {"LightGBM rf": "lightgbm", "XGBoost rf": "xgboost", "sklearn ExtraTrees": "sklearn", "sklearn RF": "sklearn"}
SMOKE = ["forest.train_images=4", "forest.test_images=2", "forest.image_height=120", "forest.image_width=160",
         "forest.images_per_block=2", "forest.examples_per_image=300", "forest.num_trees=1", "forest.max_depth=4",
         "forest.n_offsets=16", "forest.n_thresholds=8", "forest.preprocess.compose_prob=0.0",
         "forest.partitions_by_depth=[]"]
# "variants": orchard with a change switched off (VARIANTS), the "before" of issue 34's
# before/after: the same trees, so the same accuracy, and its time
SIZES = {"full": {"shape": "today", "overrides": SHAPES["today"], "scaling": True, "variants": list(VARIANTS)},
         "mid": {"shape": "mid", "overrides": SHAPES["mid"], "scaling": True, "variants": list(VARIANTS), "profile": True,
                 "limit_s": 10 * 60,
                 "skip": {"sklearn RF": "exact splits over 1,000 candidates at every node: over an hour on 2 cores"}},
         "paper": {"shape": "paper", "overrides": SHAPES["paper"], "scaling": False, "profile": True,
                   # a peer still training after 15 min (several times orchard's time) is stopped:
                   # the bench stays under an hour, and "slower than orchard" is already decided
                   "limit_s": 15 * 60,
                   # RandomForest sorts every one of its 2,000 candidates' values at every node (exact
                   # splits, not 50 thresholds): hours for one tree on 2 cores, so not run here
                   "skip": {"sklearn RF": "exact splits over 2,000 candidates at every node take hours on 2 cores"}},
         "beyond": {"shape": "beyond", "overrides": SHAPES["beyond"], "scaling": False, "profile": True,
                    # what orchard's process tree may peak at (PSS): half the machine, where the
                    # peers' matrix alone is more than all of it
                    "memory_budget_gib": 12},
         "smoke": {"shape": "smoke", "overrides": SMOKE, "scaling": True, "variants": list(VARIANTS)}}
ESTIMATE = ("today shape ~8 min on 2 idle cores (3 repeats); mid shape ~16 min (3 repeats); "
            "paper shape ~12 min (a peer is stopped after 15 min) and ~17 GB RAM; beyond-memory shape ~35 min "
            "(1 repeat, orchard alone: rendering 1,700 scenes and one tree over 3.4M pixels)")


def prepare(overrides: list[str]) -> tuple[dict, Path, str, int]:
    """The composed config, a folder with the train/test blocks, a line describing them, and the
    bytes of the peers' float32 feature matrix."""
    from orchard.config import compose

    cfg = compose(["workload=forest", *overrides])
    f = cfg["forest"]
    data_dir = Path(tempfile.mkdtemp(prefix="forest_bench_"))
    train_blocks, test_blocks = corpus(cfg, data_dir)
    save_blocks(data_dir / "train.npz", train_blocks)
    save_blocks(data_dir / "test.npz", test_blocks)
    pixels = sum(len(b["ex_img"]) for b in train_blocks)
    test_pixels = int(sum(((b["labels"] < 31) & (b["depths"] > 0)).sum() for b in test_blocks))
    matrix_bytes = pixels * f["num_trees"] * f["n_offsets"] * 4
    shape = (f"{pixels:,} training pixels ({f['train_images']} scenes), {test_pixels:,} test pixels; "
             f"{f['num_trees']} trees x {f['n_offsets']} offsets x {f['n_thresholds']} thresholds, depth "
             f"{f['max_depth']}; peers' matrix {matrix_bytes / 2**30:.2f} GiB")
    return cfg, data_dir, shape, matrix_bytes


def refusal(matrix_bytes: int) -> str | None:
    """Why a peer is not started: its float32 feature matrix alone exceeds this machine's memory
    (it would be killed for memory after building part of it; the bench says so up front)."""
    import psutil

    total = psutil.virtual_memory().total
    if matrix_bytes <= total:
        return None
    return (f"refused before start: its feature matrix ({matrix_bytes / 2**30:.1f} GiB as float32) exceeds "
            f"this machine's memory ({total / 2**30:.1f} GiB)")


def measure(size: dict, repeats: int, only: list[str] | None = None, profile: bool = False) -> list[dict]:
    """The rows of one shape. `only`: a subset of the systems (orchard always runs); `profile`:
    print orchard's time per round and phase (print_profile) after its first repeat."""
    import shutil

    from bench.rows import installed, missing, row

    profile = profile or size.get("profile", False)  # the big shapes print orchard's rounds into the bench's log
    cfg, data_dir, shape, matrix_bytes = prepare(size["overrides"])
    print(f"  forest {size['shape']}: {shape}", flush=True)
    cpus = os.cpu_count()
    refused = refusal(matrix_bytes)
    skip = {**size.get("skip", {}), **({p: refused for p in PEERS} if refused else {})}
    systems = ["orchard", *[p for p in PEERS if installed(PACKAGE[p]) and p not in skip
                            and (only is None or p in only)]]
    if size["scaling"] and (only is None or "orchard@1" in only):
        systems.append("orchard@1")
    systems += [v for v in size.get("variants", []) if only is None or v in only]
    if size["scaling"] and (only is None or TWO_NODES in only):
        systems.append(TWO_NODES)
    runs = {name: [] for name in systems}
    try:
        for _ in range(repeats):
            for name in systems:  # alternate: a change of load hits every system alike
                runs[name].append(measure_one(name, cfg, data_dir, profile=profile and name == "orchard",
                                              limit_s=None if name == "orchard" else size.get("limit_s")))
                result = runs[name][-1]
                print(f"  forest: {name}: {({k: v for k, v in result.items() if k != 'profile'})}", flush=True)
                if "profile" in result and len(runs[name]) == 1:
                    print_profile(result["profile"])
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    failed = {n: r[-1]["error"] for n, r in runs.items() if "error" in r[-1]}
    if "orchard" in failed:
        raise RuntimeError(f"orchard failed: {failed['orchard']}")
    o = runs["orchard"]

    def acc(r):
        return {"pixel acc": r["acc"][0], "class acc": r["acc"][1], "peak RSS GiB": r["peak_bytes"] / 2**30,
                "peak PSS GiB": r.get("peak_pss_bytes", 0) / 2**30}

    def parallelism(side: list[dict]) -> dict:  # the paper's effective parallelism, medians over the repeats
        return {f"effective parallelism, {k}": float(np.median([r["parallelism"][k] for r in side]))
                for k in side[-1]["parallelism"]}

    rows = []
    for peer in PEERS:
        name = f"{size['shape']}: orchard vs {peer}"
        if refused and peer in skip:  # issue 34, Must-have 3: orchard trains where the peer cannot start
            budget = size["memory_budget_gib"]
            rows.append(row(name, "s", [r["train_s"] for r in o], [], orchard_label=f"orchard, {cpus} workers",
                            peer_label=peer, higher_is_better=False, status=refused,
                            target={"text": f"orchard trains on it, its peak memory (PSS) under {budget} GiB",
                                    "met": o[-1]["peak_pss_bytes"] < budget * 2**30, "any_n": True},
                            quality={"orchard": {**acc(o[-1]), **parallelism(o)}},
                            note=shape if peer == PEERS[0] else ""))
            continue
        if peer in skip:
            rows.append(row(name, "s", [], [], orchard_label="orchard", peer_label=peer, higher_is_better=False,
                            status=f"not run at this shape: {skip[peer]}"))
            continue
        if only is not None and peer not in only:
            continue  # left out on the command line
        if peer not in runs:
            rows.append(missing(name, peer, PACKAGE[peer]))
            continue
        p = runs[peer]
        if peer in failed:  # the orchard side and what the peer used until it died or was stopped
            stopped = p[-1].get("stopped_after_s")
            target = None
            if stopped and peer == "LightGBM rf" and size["shape"] == "paper":  # still running: a lower bound
                target = {"text": f"faster than LightGBM (stopped after {stopped / 60:.0f} min), under a quarter "
                                  "of its peak memory by then",
                          "met": o[-1]["train_s"] < stopped and o[-1]["peak_pss_bytes"] < p[-1]["peak_pss_bytes"] / 4}
            rows.append(row(name, "s", [r["train_s"] for r in o], [], orchard_label=f"orchard, {cpus} workers",
                            peer_label=peer, higher_is_better=False, status=f"failed: {failed[peer]}", target=target,
                            quality={"orchard": acc(o[-1]), "peer": {"peak RSS GiB": p[-1]["peak_bytes"] / 2**30,
                                                                     "peak PSS GiB": p[-1]["peak_pss_bytes"] / 2**30}},
                            note=shape if peer == PEERS[0] else ""))
            continue
        target = None
        if peer == "LightGBM rf" and size["shape"] == "today":
            target = {"text": "within 1.5x of LightGBM at no lower class accuracy", "min_ratio": 1 / 1.5,
                      "quality_ok": o[-1]["acc"][1] >= p[-1]["acc"][1]}
        if peer == "LightGBM rf" and size["shape"] == "paper":  # issue 20: memory by PSS (see the sampler)
            target = {"text": "faster than LightGBM counting its matrix, under a quarter of its peak memory (PSS; RSS beside it)",
                      "min_ratio": 1.0, "quality_ok": o[-1]["peak_pss_bytes"] < p[-1]["peak_pss_bytes"] / 4}
        rows.append(row(name, "s", [r["train_s"] for r in o], [r["train_s"] + r["matrix_s"] for r in p],
                        orchard_label=f"orchard, {cpus} workers", peer_label=f"{peer} (matrix + train)",
                        higher_is_better=False, target=target,
                        quality={"orchard": acc(o[-1]),
                                 "peer": {**acc(p[-1]), "matrix s": p[-1]["matrix_s"], "train s": p[-1]["train_s"]}},
                        note=shape if peer == PEERS[0] else ""))
    for name, variant in VARIANTS.items():
        if name not in runs or name in failed:
            continue
        before = runs[name]
        same = "yes" if round(before[-1]["acc"][1], 4) == round(o[-1]["acc"][1], 4) else "NO"
        rows.append(row(f"{size['shape']}: orchard with {variant['change']} vs without", "s",
                        [r["train_s"] for r in o], [r["train_s"] for r in before], higher_is_better=False,
                        orchard_label=f"orchard, {cpus} workers", peer_label=f"orchard, {cpus} workers, {variant['label']}",
                        quality={"orchard": {**acc(o[-1]), "same class acc to 4 decimals": same},
                                 "peer": acc(before[-1])}))
    # issue 34, Must-have 1. Where no peer comes within FASTEST_WITHIN of orchard's class accuracy
    # the condition would hold vacuously: the row then holds orchard to the same ratio against the
    # most accurate peer, and says so
    fastest, why = fastest_peer(runs, failed, o), "the fastest at orchard's class accuracy"
    if fastest is None:
        fastest = most_accurate_peer(runs, failed)
        why = f"none within {FASTEST_WITHIN} of orchard's class accuracy: the most accurate peer"
    if fastest:
        p = runs[fastest]
        rows.append(row(f"{size['shape']}: orchard vs the fastest peer at its class accuracy", "s",
                        [r["train_s"] for r in o], [r["train_s"] + r["matrix_s"] for r in p],
                        orchard_label=f"orchard, {cpus} workers", peer_label=f"{fastest} (matrix + train; {why})",
                        higher_is_better=False,
                        target={"text": f"at most 0.8x the time of the fastest peer whose class accuracy is within "
                                        f"{FASTEST_WITHIN} of orchard's or above", "min_ratio": 1 / 0.8},
                        quality={"orchard": acc(o[-1]), "peer": acc(p[-1])}))
    if "orchard@1" in runs:
        one = runs["orchard@1"]

        rows.append(row(f"{size['shape']}: orchard {cpus} workers vs 1 (speed-up)", "s",
                        [r["train_s"] for r in o], [r["train_s"] for r in one], higher_is_better=False,
                        orchard_label=f"orchard, {cpus} workers", peer_label="orchard, 1 worker",
                        quality={"orchard": {**acc(o[-1]), **parallelism(o)}, "peer": {**acc(one[-1]), **parallelism(one)}}))
    if TWO_NODES in runs and TWO_NODES not in failed:  # issue 34, Must-have 4: the paper's figure on two nodes
        two = runs[TWO_NODES]
        rows.append(row(f"{size['shape']}: orchard on one node vs two nodes (same CPUs)", "s",
                        [r["train_s"] for r in o], [r["train_s"] for r in two], higher_is_better=False,
                        orchard_label=f"orchard, {cpus} workers, one node",
                        peer_label=f"orchard, {cpus} workers on a two-node ray.cluster_utils.Cluster "
                                   f"({cpus // 2} + {cpus - cpus // 2} CPUs)",
                        quality={"orchard": {**acc(o[-1]), **parallelism(o)},
                                 "peer": {**acc(two[-1]), **parallelism(two), "nodes": two[-1]["nodes"]}}))
    return rows


RANKED_PEERS = ("LightGBM rf", "XGBoost rf", "sklearn ExtraTrees")  # the peers issue 34 ranks orchard against


def _finished(runs: dict, failed: dict) -> list[str]:
    return [p for p in RANKED_PEERS if p in runs and p not in failed]


def fastest_peer(runs: dict, failed: dict, orchard: list[dict]) -> str | None:
    """The peer (of RANKED_PEERS) with the lowest median time (matrix + training) among those
    whose class accuracy is at least orchard's less FASTEST_WITHIN."""
    floor = orchard[-1]["acc"][1] - FASTEST_WITHIN
    eligible = {p: float(np.median([r["train_s"] + r["matrix_s"] for r in runs[p]]))
                for p in _finished(runs, failed) if runs[p][-1]["acc"][1] >= floor}
    return min(eligible, key=eligible.get) if eligible else None


def most_accurate_peer(runs: dict, failed: dict) -> str | None:
    """The peer (of RANKED_PEERS) with the highest class accuracy."""
    done = {p: runs[p][-1]["acc"][1] for p in _finished(runs, failed)}
    return max(done, key=done.get) if done else None


def print_profile(rounds: list[dict]) -> None:
    """orchard's seconds per round and phase, and the share of each phase in the whole."""
    cols = ("bin_cache_s", "phase1_s", "phase2_s", "phase3_s", "phase4_s", "total_s")
    print("| tree | depth | frontier | batches | bin cache | phase 1 | phase 2 | phase 3 | phase 4 | round | parallelism | shuffle MB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rounds:
        print(f"| {r['tree']} | {r['depth']} | {r['frontier']} | {r['batches']} | "
              + " | ".join(f"{r[c]:.2f}" for c in cols)
              + f" | {r['parallelism']:.2f} | {r['shuffle_bytes'] / 1e6:.1f} |")
    total = sum(r["total_s"] for r in rounds) or 1.0
    print("| all | | | " + str(sum(r["batches"] for r in rounds)) + " | "
          + " | ".join(f"{100 * sum(r[c] for r in rounds) / total:.0f}%" for c in cols[:-1])
          + f" | {total:.1f} s | | |", flush=True)


def main(argv: list[str] | None = None) -> None:
    """``python bench/forest_vs_peers.py [--shape today|paper|both] [--profile] [--systems a,b]
    [--repeats N]``: the table of both shapes on this terminal, nothing written to docs/ (the
    results that docs/benchmarks.md shows come from ``python -m bench forest forest_paper``)."""
    import argparse

    from bench.render import quality, side
    from bench.rows import summarize

    names = ("orchard@1", TWO_NODES, *VARIANTS, *PEERS)
    parser = argparse.ArgumentParser(prog="python bench/forest_vs_peers.py", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["today", "mid", "paper", "beyond", "both", "smoke"], default="both",
                        help="smoke: a few small images, to try the command in seconds")
    parser.add_argument("--profile", action="store_true", help="print orchard's time per round and phase")
    parser.add_argument("--systems", default=None, help=f"comma-separated peers to run besides orchard: {', '.join(names)}")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    only = None if args.systems is None else [s.strip() for s in args.systems.split(",") if s.strip() != "orchard"]
    unknown = [s for s in only or [] if s not in names]
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)}; allowed: orchard, {', '.join(names)}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    for shape in (["today", "paper"] if args.shape == "both" else [args.shape]):
        size = SIZES["full" if shape == "today" else shape]  # "today" is the bench's "full" size
        rows = [summarize(r) for r in measure(size, args.repeats, only, args.profile)]
        # a target is named, never called met here: that needs the runner's load sampling
        print("\n| row | orchard | peer | ratio | orchard quality | peer quality | target |\n"
              "| --- | --- | --- | ---: | --- | --- | --- |")
        for r in rows:
            ratio = f"{r['ratio']:.3g}x" if r.get("ratio") else "-"
            print(f"| {r['name']} | {side(r['orchard'], r['unit'])} | {side(r['peer'], r['unit'])} | {ratio} | "
                  f"{quality(r['quality'].get('orchard'))} | {quality(r['quality'].get('peer'))} | "
                  f"{r['status'] if r['status'] != 'ok' else (r['target'] or {}).get('text', '-')} |")
        print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
    main()
