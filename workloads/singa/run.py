"""The entry of a singa train run (the core calls ``run``): resolve the net (``singa.app`` or the
user's ``singa.net``) and the arch, (pre-)train under the architecture with an evaluation every
epoch, then the app's extras (retrieval for msae), the logged model and the figures (t-SNE,
learning curves, the architectures side by side)."""
from __future__ import annotations

import yaml

from .checkpoint import Checkpointer, previous
from .evaluate import msae_retrieval
from .figures import log_architecture_comparison, log_learning_curves, log_tsne_figures, start_tsne_figures
from .layers.base import import_layer_modules
from .settings import load_net, resolve_arch, resolve_training
from .train import train_stages


def run(cfg: dict, ctx) -> dict[str, float]:
    """Train ``singa.app`` (or the ``singa.net`` file) with ``singa.arch``; log per-epoch and
    final metrics; return finals."""
    s = cfg["singa"]
    # 1. data: the net, the data it reads and how it trains (settings.py), the arch; the groups
    #    load their own share of the data (data.py)
    import_layer_modules(s.get("layer_modules"))  # the driver builds nets too (t-SNE, retrieval)
    app = load_net(cfg)
    train = resolve_training(cfg, app)
    arch = resolve_arch(cfg)
    ctx.log_params({"singa.resolved_arch": arch, "singa.resolved_updater": train["updater"],
                    "singa.resolved_data": train["data"], "singa.resolved_batch_size": train["batch_size"]})
    if s.get("net"):
        ctx.log_text(yaml.safe_dump(app, sort_keys=False), "net.yaml")
    ctx.mark("data")

    # 2. train: every stage under the architecture (train.py). A resumed run (python -m orchard
    #    resume) starts from the previous run's last checkpoint: stages finished before it are
    #    skipped, the stage it was in goes on from its epoch (checkpoint.py).
    final: dict[str, float] = {}
    initial = None
    resumed = previous(ctx.previous_storage)
    if resumed is not None:
        initial = resumed["params"]
        final["train/resumed_from_epoch"] = float(resumed["epoch"])

    saver = Checkpointer(ctx.storage, int(cfg["strategy"].get("checkpoint_every", 1) or 1))
    # a lost node: the architecture is rebuilt on the nodes alive (train.fit); what it cost is logged
    from orchard.api import NodeWatch, Rebuilds

    with NodeWatch(ctx) as watch:
        rebuilds = Rebuilds(watch, int(cfg["strategy"].get("max_failures", 0) or 0))
        try:
            initial, out, spec = train_stages(cfg, ctx, app, train, arch, resumed, initial, saver, final, rebuilds)
        finally:
            ctx.log_metrics(rebuilds.metrics())
    ctx.mark("training")

    # 3. evaluate: the app's extras on the trained parameters (evaluate.py); the test accuracy of
    #    every epoch is train.fit's
    if s["app"] == "msae" and not s.get("net"):
        final.update(msae_retrieval(spec, out["params"], ctx))
    ctx.mark("evaluation")

    # 4. log model and figures: the MLflow Model, artifact model/ (predict.py, docs/models.md);
    #    t-SNE of the tsne_layers (drawn in the side process while the model is logged), learning
    #    curves, this arch beside the others (figures.py)
    from .predict import log_model

    tsne = {}
    if s.get("tsne") and app.get("tsne_layers"):
        tsne = start_tsne_figures(spec, out["params"], app["tsne_layers"], int(s["tsne_samples"]), ctx.side)
    log_model(ctx, spec, out["params"])
    ctx.mark("model")
    final.update(log_tsne_figures(tsne, ctx))
    log_learning_curves(ctx, s.get("net") or s["app"], s["arch"], train.get("target_accuracy"))
    log_architecture_comparison(ctx, cfg, final)
    ctx.mark("figures")
    return final
