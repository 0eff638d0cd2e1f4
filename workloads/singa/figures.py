"""singa's pictures in MLflow (``figures/``): how the net learned under its architecture, and what
its hidden layers learned.

- ``learning_curves.png``: per epoch, the losses (train, test; pre-training stages'
  reconstruction errors) and the test accuracy against the app's target, titled with the app
  and the architecture (``singa.arch``): runs of one app under different archs compare side by
  side in MLflow and in ``notebooks/singa_architectures.ipynb``;
- ``tsne_<layer>.png``: 2-d t-SNE of a hidden layer's features on test images, one colour per
  class (Appendix A, Fig. 7/8/15);
- ``architectures.png`` (with ``tables/architectures.json``): this run beside the latest
  finished run of every other architecture (``singa.arch`` and its ``singa.cluster`` overrides)
  of the same net, data and size in the same MLflow experiment: time to the target accuracy and
  bytes moved per step (Fig. 12-14 in miniature).  Run the archs one after another and the last
  run's figure compares them all; ``python -m workloads.singa.figures <tracking uri> <png>``
  draws the same from a store (docs/singa.md).

They are drawn in the run's side process (``ctx.side``, ``background.SideProcess``: the core
starts it as Ray starts, at the lowest CPU priority, with the imports ``SIDE_IMPORTS`` names in
__init__.py): it imports scikit-learn and pyplot on CPU that Ray's start and the groups leave
over, and runs the t-SNE while the driver logs the model; the driver only computes the features
and reads the store, and logs the PNGs it gets back.
"""
from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import numpy as np
from matplotlib.ticker import MaxNLocator

from orchard.api import drawn_png, logged_series, pyplot


_NOT_CURVES = ("throughput/", "time/", "wire/", "system/", "tsne/", "reached_target")


def beside(side, fn, *args) -> Future:
    """``fn(*args)`` in the side process (``ctx.side``); here, done, where the run has none (a
    run context made by hand)."""
    if side is not None:
        return side.submit(fn, *args)
    done: Future = Future()
    done.set_result(fn(*args))
    return done


def drawn_beside(side, draw, *args) -> bytes:
    """``draw(*args)``'s figure as PNG bytes, drawn in the side process (here if it has ended)."""
    try:
        return beside(side, drawn_png, draw, *args).result()
    except BrokenProcessPool:
        return drawn_png(draw, *args)


def log_learning_curves(ctx, app: str, arch: str, target: float | None) -> None:
    """Draw the run's per-epoch losses and accuracies (as logged) into ``learning_curves.png``."""
    series = logged_series(ctx, lambda k: not any(p in k for p in _NOT_CURVES)
                           and k.rsplit("/", 1)[-1].split("_")[-1] in ("loss", "accuracy", "error"))
    if not series:
        return
    png = drawn_beside(ctx.side, learning_curves_figure, series, f"singa.app={app}, singa.arch={arch}", target)
    ctx.log_bytes(png, "figures/learning_curves.png")


def learning_curves_figure(series: dict[str, tuple[list[int], list[float]]], title: str, target: float | None):
    """Left: every loss / reconstruction-error series; right: every accuracy series (epochs on x)."""
    plt = pyplot()
    losses = {k: v for k, v in series.items() if not k.endswith("accuracy")}
    accs = {k: v for k, v in series.items() if k.endswith("accuracy")}
    panels = [p for p in ((losses, "loss / reconstruction error"), (accs, "accuracy")) if p[0]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    for ax, (group, ylabel) in zip(axes[0], panels):
        for key, (steps, values) in group.items():
            ax.plot(steps, values, marker="o", ms=4, label=key)
        if ylabel == "accuracy":
            if target is not None:
                ax.axhline(target, color="tab:red", lw=1, ls="--", label=f"target {target:g}")
            ax.set_ylim(0, 1.02)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def tsne_problem(features: np.ndarray) -> str | None:
    """Why t-SNE cannot embed ``features`` (N, ...), or None: scikit-learn raises on NaN or inf,
    and on features equal for every sample (a net that collapsed under a too-high lr) its
    Barnes-Hut tree ends the whole process with a segmentation fault."""
    flat = features.reshape(len(features), -1)
    if not np.isfinite(flat).all():
        return "are not all finite"
    if not (flat.max(axis=0) > flat.min(axis=0)).any():
        return "are the same for every image (the net collapsed: a lower singa.lr may help)"
    return None


EXACT_TSNE_MAX = 200  # points up to which t-SNE runs exact (O(N^2) per iteration)


def tsne_figure(features: np.ndarray, labels: np.ndarray, title: str, seed: int = 0):
    """(N, D) features and (N,) class ids -> a matplotlib figure of the 2-d t-SNE embedding,
    one colour per class."""
    from sklearn.manifold import TSNE

    plt = pyplot()
    features = features.reshape(len(features), -1).astype(np.float32)
    perplexity = float(min(30.0, max(5.0, (len(features) - 1) / 4)))
    # exact below a few hundred points: Barnes-Hut's tree costs more than it saves there (60
    # points, debug=smoke's size: 0.67 s exact against 1.96 s Barnes-Hut on the 2-core machine
    # under a test run; 300: about even)
    method = "exact" if len(features) <= EXACT_TSNE_MAX else "barnes_hut"
    emb = TSNE(n_components=2, perplexity=perplexity, init="pca", max_iter=500, random_state=seed,
               method=method).fit_transform(features)
    fig, ax = plt.subplots(figsize=(5.6, 5))
    sc = ax.scatter(emb[:, 0], emb[:, 1], c=labels, cmap="tab10", s=10)
    ax.legend(*sc.legend_elements(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, title="class")
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    return fig


def start_tsne_figures(spec: dict, params: dict, layers: list[str], samples: int, side) -> dict:
    """Appendix A: the features of ``samples`` test images at each of ``layers`` (on the driver),
    their t-SNE figures set drawing in the side process; returns ``{layer: job}`` for
    ``log_tsne_figures``."""
    from .evaluate import features_of_test_set, local_net

    net, data = local_net(spec, params)
    feats = features_of_test_set(net, data, layers, limit=samples)
    labels = data.test["label"][: len(next(iter(feats.values())))]
    if labels.ndim > 1:
        labels = labels.argmax(1)
    jobs = {}
    for name, f in feats.items():
        problem = tsne_problem(f)
        if problem is not None:  # a line instead of a figure (or a crash: see tsne_problem)
            print(f"singa: no t-SNE figure of {name}: its features {problem}", flush=True)
            continue
        jobs[name] = beside(side, tsne_png, f, labels, name, spec["seed"])
    return jobs


def tsne_png(features: np.ndarray, labels: np.ndarray, layer: str, seed: int) -> tuple[bytes, float]:
    """(In the side process) one layer's t-SNE figure as PNG bytes, and its features' 10-NN class
    purity (how well they cluster by class)."""
    from .evaluate import neighbourhood_purity

    purity = neighbourhood_purity(features, labels)
    title = f"t-SNE of {layer} ({len(features)} test samples; 10-NN class purity {purity:.2f})"
    return drawn_png(tsne_figure, features, labels, title, seed), purity


def log_tsne_figures(jobs: dict, ctx) -> dict[str, float]:
    """Each layer's t-SNE figure (``start_tsne_figures``) logged once drawn; returns each
    layer's neighbourhood purity."""
    out = {}
    for name, job in jobs.items():
        try:
            png, out[f"tsne/{name}_purity"] = job.result()
        except BrokenProcessPool as exc:  # the process ended under it (a crash in the t-SNE): the run goes on
            print(f"singa: no t-SNE figure of {name}: the process drawing it ended ({exc})", flush=True)
            continue
        ctx.log_bytes(png, f"figures/tsne_{name}.png")
    return out


# What makes two runs comparable, and what tells their architectures apart (MLflow params).
_SAME = ("workload.name", "singa.app", "singa.net", "singa.resolved_data", "smoke", "seed")
_COMPARED = ("time/to_target_s", "wire/bytes_per_step", "test/accuracy", "test/target_accuracy",
             "throughput/images_per_s", "time/train_s")


def arch_label(params: dict) -> str:
    """``async_ps sample_ratio=0.5``: the arch a run asked for and its ``singa.cluster`` overrides."""
    extra = [f"{k.split('.')[-1]}={v}" for k, v in sorted(params.items())
             if k.startswith("singa.cluster.") and v not in ("None", "null", None)]
    return " ".join([str(params.get("singa.arch"))] + extra)


def architecture_rows(client, experiment_id: str, like: dict, current: dict | None = None) -> list[dict]:
    """One row per architecture label: the newest FINISHED run whose params match ``like`` on
    ``_SAME`` (``current``, this run's own ``{"label", "run_id", metrics...}``, replaces its label's
    row).  Each row: label, run_id and the ``_COMPARED`` metrics it has."""
    rows: dict[str, dict] = {}
    for run in client.search_runs([experiment_id], "attributes.status = 'FINISHED'",
                                  order_by=["attributes.start_time DESC"], max_results=500):
        params = run.data.params
        if any(params.get(k) != like.get(k) for k in _SAME):
            continue
        label = arch_label(params)
        if label not in rows:
            rows[label] = {"label": label, "run_id": run.info.run_id,
                           **{k: v for k, v in run.data.metrics.items() if k in _COMPARED}}
    if current is not None:
        rows[current["label"]] = current
    order = ("local", "sync_ps", "async_ps", "replicated", "allreduce")
    return sorted(rows.values(), key=lambda r: (next((i for i, a in enumerate(order) if r["label"].startswith(a)),
                                                     len(order)), r["label"]))


def architectures_figure(rows: list[dict], title: str):
    """Left: time to the target accuracy (s of training; 'not reached' where it was not);
    right: bytes all groups moved per step (MB), one bar per architecture."""
    plt = pyplot()
    labels = [r["label"].replace(" ", "\n", 1) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axes[0]
    times = [r.get("time/to_target_s") for r in rows]
    bars = ax.bar(labels, [t or 0.0 for t in times], color="tab:blue")
    for bar, t, r in zip(bars, times, rows):
        acc = r.get("test/accuracy")
        note = f"{t:.1f} s" if t is not None else "not reached"
        ax.annotate(f"{note}\nacc {acc:.3f}" if acc is not None else note, (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=7)
    target = next((r["test/target_accuracy"] for r in rows if r.get("test/target_accuracy") is not None), None)
    ax.set_ylabel("training time to target (s)" + (f", target {target:g}" if target is not None else ""))
    ax = axes[1]
    mb = [r.get("wire/bytes_per_step", 0.0) / 1e6 for r in rows]
    bars = ax.bar(labels, mb, color="tab:orange")
    for bar, v in zip(bars, mb):
        ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=7)
    ax.set_ylabel("MB moved per step (all groups)")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def log_architecture_comparison(ctx, cfg: dict, final: dict) -> None:
    """``figures/architectures.png`` and ``tables/architectures.json``: this run (its ``final``
    metrics, not yet in the store) beside the other architectures' latest runs (see the module
    doc).  Nothing when the run is not tracked."""
    if not ctx.run_id or not ctx.tracking_uri:
        return
    from mlflow.tracking import MlflowClient

    ctx.flush()
    client = MlflowClient(ctx.tracking_uri)
    run = client.get_run(ctx.run_id)
    current = {"label": arch_label(run.data.params), "run_id": ctx.run_id,
               **{k: v for k, v in final.items() if k in _COMPARED}}
    rows = architecture_rows(client, run.info.experiment_id, run.data.params, current)
    ctx.log_dict({"rows": rows}, "tables/architectures.json")
    ctx.log_bytes(drawn_beside(ctx.side, architectures_figure, rows, _title(run.data.params)), "figures/architectures.png")


def _title(params: dict) -> str:
    net = params.get("singa.net") if params.get("singa.net") not in (None, "None") else params.get("singa.app")
    return f"singa {net} on {params.get('singa.resolved_data')}: architectures compared (latest run of each)"


def main(argv: list[str] | None = None) -> int:
    """``python -m workloads.singa.figures <tracking uri> <out.png> [experiment, default singa]``: the
    architectures figure of the newest singa run in the store (what docs/singa.md shows)."""
    import sys

    from mlflow.tracking import MlflowClient

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m workloads.singa.figures <tracking uri> <out.png> [experiment name]", file=sys.stderr)
        return 2
    client = MlflowClient(args[0])
    name = args[2] if len(args) == 3 else "singa"  # tracking.experiment's default: the workload's name
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        print(f"no experiment {name!r} in {args[0]}", file=sys.stderr)
        return 2
    newest = client.search_runs([experiment.experiment_id], "params.`workload.name` = 'singa' and "
                                "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"], max_results=1)
    if not newest:
        print(f"no finished singa run in {args[0]}", file=sys.stderr)
        return 2
    rows = architecture_rows(client, experiment.experiment_id, newest[0].data.params)
    fig = architectures_figure(rows, _title(newest[0].data.params))
    fig.savefig(args[1], dpi=110)
    for r in rows:
        t = r.get("time/to_target_s")
        print(f"| {r['label']} | {r.get('test/accuracy', float('nan')):.3f} | "
              f"{'not reached' if t is None else f'{t:.1f} s'} | {r.get('wire/bytes_per_step', 0) / 1e6:.2f} | "
              f"{r.get('throughput/images_per_s', float('nan')):,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
