"""The driver of a singa run: resolve the net (``singa.app`` or the user's ``singa.net``) and the
arch, (pre-)train with the architecture, evaluate every epoch, then the app's extras (retrieval
for msae, t-SNE figures).  Called by ``run``."""
from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import numpy as np
import ray
import torch
import yaml

from orchard import divergence
from orchard.divergence import check_weights, word
from orchard.errors import Diverged
from workloads.singa.figures import log_architecture_comparison, log_learning_curves
from workloads.singa.layers.base import import_layer_modules
from workloads.singa.settings import (
    group_spec,
    load_net,
    resolve_arch,
    resolve_training,
)


def run_app(cfg: dict, ctx) -> dict[str, float]:
    """Train ``singa.app`` (or the ``singa.net`` file) with ``singa.arch``; log per-epoch and
    final metrics; return finals."""
    s = cfg["singa"]
    import_layer_modules(s.get("layer_modules"))  # the driver builds nets too (t-SNE, retrieval)
    app = load_net(cfg)
    train = resolve_training(cfg, app)
    arch = resolve_arch(cfg)
    ctx.log_params({"singa.resolved_arch": arch, "singa.resolved_updater": train["updater"],
                    "singa.resolved_data": train["data"], "singa.resolved_batch_size": train["batch_size"]})
    if s.get("net"):
        ctx.log_text(yaml.safe_dump(app, sort_keys=False), "net.yaml")
    final: dict[str, float] = {}
    initial = None
    # A resumed run (python -m orchard resume) starts from the previous run's last checkpoint:
    # stages finished before it are skipped, the stage it was in goes on from its epoch.
    # Checkpoints live in the run storage (orchard/storage.py): a bucket on a cluster, so a resume
    # needs nothing from the driver's disk.
    from orchard.storage import Storage

    resumed = load_checkpoint(Storage.for_run(cfg, s["resume"])) if s.get("resume") else None
    if resumed is not None:
        initial = resumed["params"]
        final["train/resumed_from_epoch"] = float(resumed["epoch"])
    saver = Checkpointer(Storage.for_run(cfg, ctx.run_dir), int(cfg["strategy"].get("checkpoint_every", 1) or 1))
    # a lost node: the architecture is rebuilt on the nodes alive (fit); what it cost is logged
    from orchard.strategies.node_loss import NodeWatch, Rebuilds

    with NodeWatch(ctx) as watch:
        rebuilds = Rebuilds(watch, int(cfg["strategy"].get("max_failures", 0) or 0))
        try:
            initial, out, spec = _train_stages(cfg, ctx, app, train, arch, resumed, initial, saver, final, rebuilds)
        finally:
            ctx.log_metrics(rebuilds.metrics())
    from workloads.singa.predict import log_model
    log_model(ctx, spec, out["params"])  # the MLflow Model: artifact model/ (docs/models.md)
    # [3] the app's extras on the trained parameters
    if s["app"] == "msae" and not s.get("net"):
        final.update(msae_retrieval(spec, out["params"], ctx))
    if s.get("tsne") and app.get("tsne_layers"):
        final.update(tsne_figures(spec, out["params"], app["tsne_layers"], int(s["tsne_samples"]), ctx))
    log_learning_curves(ctx, s.get("net") or s["app"], s["arch"], train.get("target_accuracy"))
    log_architecture_comparison(ctx, cfg, final)
    return final


def _train_stages(cfg: dict, ctx, app: dict, train: dict, arch: dict, resumed: dict | None, initial: dict | None,
                  saver, final: dict, rebuilds) -> tuple[dict | None, dict, dict]:
    """Every stage of the net: (initial params after pre-training, BP's ``fit`` output, its spec);
    the stages' final metrics go into ``final``."""
    pretrain = app.get("pretrain") or []
    # [1] CD pre-training of stacked RBMs, one stage per RBM (Table 1 hybrid: rbm/dbn)
    for i, stage in enumerate(pretrain):
        if resumed is not None and resumed["stage"] > i:
            continue
        stage_train = dict(train, updater=dict(stage.get("updater", train["updater"])),
                           batch_size=train["batch_size"])
        epochs = int(stage.get("epochs", 1)) if not cfg.get("smoke") else min(2, int(stage.get("epochs", 1)))
        spec = group_spec(cfg, app, stage_train, arch, layers=stage["layers"], algorithm="cd")
        spec["initial_params"] = initial
        out = fit(spec, arch, cfg, ctx, epochs, target=None, prefix=f"pretrain{i + 1}/",
                  start_epoch=_start(resumed, i), saver=saver.for_stage(i, initial),
                  lr=_lr_advice(cfg, arch, stage_train["updater"], pretrain_stage=i), rebuilds=rebuilds)
        initial = {**(initial or {}), **out["params"]}
        final.update({k: v for k, v in out["final"].items() if "recon_error" in k})
    # [2] BP training (or fine-tuning from the RBM weights)
    spec = group_spec(cfg, app, train, arch)
    spec["initial_params"] = initial
    out = fit(spec, arch, cfg, ctx, int(train["epochs"]), target=train.get("target_accuracy"),
              start_epoch=_start(resumed, len(pretrain)), saver=saver.for_stage(len(pretrain), initial),
              lr=_lr_advice(cfg, arch, train["updater"]), rebuilds=rebuilds)
    final.update(out["final"])
    return initial, out, spec


CHECKPOINT_NAME = "singa_checkpoint.npz"  # in the run folder: the parameters as of the last checkpointed epoch


class Checkpointer:
    """Writes the net's parameters every ``every`` epochs (``strategy.checkpoint_every``) with the
    stage (pre-training RBM i, then BP = len(pretrain)) and epoch they belong to.  npz, no pickle;
    written whole to the run storage (a local file is renamed into place, an object is published
    whole), so a kill mid-write keeps the previous checkpoint."""

    def __init__(self, storage, every: int):
        self.storage, self.every = storage, max(1, every)
        self.stage, self.base = 0, None

    def for_stage(self, stage: int, base: dict | None) -> Checkpointer:
        self.stage, self.base = stage, base
        return self

    def __call__(self, epoch: int, epochs: int, params_fn) -> None:
        if epoch % self.every and epoch != epochs:
            return
        params = {**(self.base or {}), **params_fn()}
        buffer = io.BytesIO()
        np.savez(buffer, _meta=np.array(json.dumps({"stage": self.stage, "epoch": epoch})),
                 **{f"p:{k}": np.asarray(v) for k, v in params.items()})
        self.storage.write_bytes(CHECKPOINT_NAME, buffer.getvalue())


def load_checkpoint(source) -> dict:
    """``{"stage", "epoch", "params"}`` of a checkpoint written by ``Checkpointer``: a file path,
    or the run storage (``orchard.storage.Storage``) holding ``CHECKPOINT_NAME``."""
    if hasattr(source, "read_bytes") and not isinstance(source, Path):
        source = io.BytesIO(source.read_bytes(CHECKPOINT_NAME))
    with np.load(source, allow_pickle=False) as data:
        meta = json.loads(str(data["_meta"]))
        params = {k[2:]: np.array(data[k]) for k in data.files if k.startswith("p:")}
    return {**meta, "params": params}


def _finite(params: dict, epoch: int, step: int, lr: dict | None) -> dict:
    """``params`` if every array is finite, else ``Diverged``: a checkpoint never holds NaN."""
    check_weights(params.values(), epoch=epoch, step=step, **(lr or {}))
    return params


def _lr_advice(cfg: dict, arch: dict, updater: dict, pretrain_stage: int | None = None) -> dict:
    """The config key that sets the learning rate a diverged stage ran with, and its value:
    ``singa.lr``; on servers with their own rule (async_ps's AdaGrad) that rule (lr and all); a CD
    pre-training stage's lr lives in the net file, named in the hint."""
    if pretrain_stage is not None:
        where = cfg["singa"].get("net") or f"conf/singa/apps/{cfg['singa']['app']}.yaml"
        return {"key": None, "hint": f"lower pretrain[{pretrain_stage}].updater.lr in {where} "
                                     f"(now {float(updater.get('lr', 0.01)):g})"}
    server = arch.get("server_updater") if arch["name"] in ("sync_ps", "async_ps", "replicated") else None
    if server:  # a dict key: given whole, e.g. singa.cluster.server_updater={name:adagrad,lr:0.001}
        rule = ",".join(f"{k}:{v}" for k, v in server.items())
        return {"key": "singa.cluster.server_updater", "value": f"{{{rule}}}"}
    return {"key": "singa.lr", "value": float(updater.get("lr", 0.01))}


def _start(resumed: dict | None, stage: int) -> int:
    """The epoch a stage starts from: the checkpoint's for the stage it was in, else 0."""
    return int(resumed["epoch"]) if resumed is not None and resumed["stage"] == stage else 0


def _cpus_per_group(cfg: dict, arch: dict) -> float:
    total = float(ray.cluster_resources().get("CPU", 1.0))
    servers = int(arch.get("server_groups", 0) or 0) * int(arch.get("servers_per_group", 0) or 0)
    free = max(0.1, total - servers * float(arch.get("cpus_per_server", 0.0)))
    want = float(cfg["strategy"].get("cpus_per_worker", 1) or 1)
    return round(min(want, free / int(arch["worker_groups"])), 3)


def _rename(metrics: dict[str, float], split: str) -> dict[str, float]:
    """``loss/accuracy`` -> ``test/accuracy``; other loss layers keep their name: ``test/iloss_loss``."""
    out = {}
    for key, value in metrics.items():
        layer, name = key.split("/", 1)
        out[f"{split}/{name}" if layer == "loss" else f"{split}/{layer}_{name}"] = value
    return out


def _restore_point(saver, start_epoch: int, initial: dict | None) -> tuple[int, dict | None]:
    """Where a rebuilt architecture goes on: this stage's last checkpoint (epoch, parameters),
    else the stage's own start."""
    if saver is not None and saver.storage.exists(CHECKPOINT_NAME):
        ckpt = load_checkpoint(saver.storage)
        if ckpt["stage"] == saver.stage:
            return int(ckpt["epoch"]), ckpt["params"]
    return start_epoch, initial


def _rebuild(arch: dict, spec: dict, cfg: dict, bound_s: float):
    """The architecture again on the nodes alive, with the CPUs they have. Tried again while Ray
    still places a group on the node going away (its start is cancelled), up to ``bound_s``."""
    from orchard.strategies.node_loss import NotPlaced
    from workloads.singa.architectures import Architecture

    deadline = time.monotonic() + bound_s
    while True:
        try:
            return Architecture(arch, spec, _cpus_per_group(cfg, arch), max(1.0, deadline - time.monotonic()))
        except NotPlaced:
            raise
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def fit(spec: dict, arch: dict, cfg: dict, ctx, epochs: int, target: float | None, prefix: str = "",
        start_epoch: int = 0, saver=None, lr: dict | None = None, rebuilds=None) -> dict:
    """Run epochs ``start_epoch + 1 .. epochs`` of ``spec`` under ``arch``; evaluate after every
    epoch; ``saver(epoch, epochs, params_fn)`` checkpoints.  A NaN or infinite training loss (or
    non-finite weights at a checkpoint) raises ``Diverged`` naming ``lr`` (``_lr_advice``): the
    last checkpoint stays the last finite one (orchard/divergence.py).

    ``rebuilds`` (``node_loss.Rebuilds``): a group or server lost with its node ends the round;
    the architecture is built again on the nodes alive (the same groups, with the CPUs left)
    from the stage's last checkpoint, up to ``strategy.max_failures`` times."""
    from workloads.singa.architectures import Architecture
    from orchard.strategies.node_loss import start_bound_s

    bound = start_bound_s(cfg)
    machine = Architecture(arch, spec, _cpus_per_group(cfg, arch), bound)
    mark = rebuilds.started() if rebuilds is not None else 0
    try:
        part = machine.data_partition
        ctx.log_params({f"singa.{prefix}data_partition": f"{spec['data']}: train {sum(part['train_per_group'])} = "
                        f"{'+'.join(map(str, part['train_per_group']))} (strided, one share per group), "
                        f"test {part['test']} (all)"})
        if machine.plan:
            ctx.log_dict(machine.plan, f"tables/{prefix.strip('/') or 'train'}_partition_plan.json")
            ctx.log_params({f"singa.{prefix}partition_plan": ",".join(f"{k}:{v}" for k, v in machine.plan.items()
                                                                       if v != "whole")})
        spe = machine.steps_per_epoch
        total, done, train_s, reached = epochs * spe, start_epoch * spe, 0.0, None
        first = done
        images_per_step = spec["batch_size"] * machine.num_groups
        last_eval: dict[str, float] = {}
        train_metrics: dict[str, float] = {}
        while done < total:
            try:
                steps = min(machine.round_length(), total - done)
                t0 = time.perf_counter()
                train_metrics = machine.run_steps(steps)
                train_s += time.perf_counter() - t0
                # [diverged?] the groups watched every step's loss; the first NaN/inf ends the run here
                bad = machine.first_non_finite()
                if bad is not None:
                    step = first + bad[0]  # of this stage, counted from its start
                    name = next(iter(_rename({bad[1]: 0}, "train")))[len("train/"):] if "/" in bad[1] else bad[1]
                    raise Diverged(prefix + name, word(bad[2]), math.ceil(step / spe), step, **(lr or {}))
                before, done = done, done + steps
                if done // spe == before // spe and done < total:
                    continue
                # [epoch end] evaluate on the test set, log the epoch's figures
                epoch = math.ceil(done / spe)
                last_eval = _rename(machine.evaluate(), "test")
                rate = (done - first) * images_per_step / max(train_s, 1e-9)
                metrics = {**last_eval, **_rename(train_metrics, "train"), "throughput/images_per_s": rate,
                           "time/train_s": train_s}
                acc = last_eval.get("test/accuracy")
                if target is not None and acc is not None and acc >= target and reached is None:
                    reached = train_s
                ctx.log_metrics({prefix + k: v for k, v in metrics.items()}, step=epoch)
                ctx.progress(epoch, epochs, desc=f"{prefix}epoch {epoch}/{epochs}", **{"img/s": rate})
                if saver is not None:
                    saver(epoch, epochs, lambda: _finite(machine.params(), epoch, done, lr))
            except Diverged:
                raise
            except Exception as exc:  # noqa: BLE001 - a lost node is rebuilt after; anything else raises
                if rebuilds is None or not rebuilds.recoverable(exc, mark):
                    raise
                # [lost a node] the same groups again on the nodes alive, from the last checkpoint
                machine.abandon()
                machine = None  # nothing of it to shut down if the new one cannot start
                epoch, params = _restore_point(saver, start_epoch, spec.get("initial_params"))
                machine = _rebuild(arch, {**spec, "initial_params": params}, cfg, bound)
                done, mark = epoch * spe, rebuilds.started()
                ctx.log_metrics({"train/restarts": rebuilds.restarts, prefix + "train/resumed_from_epoch": epoch,
                                 "train/group_nodes": len(set(machine.nodes))}, step=rebuilds.restarts)
        if not last_eval:  # resumed after its last epoch: nothing left to train, still report
            last_eval = _rename(machine.evaluate(), "test")
        stats = machine.stats()
        params = machine.params()
    except Diverged as err:  # recorded, and whether a checkpoint (of finite weights) is there to resume
        err.checkpoint = saver is not None and saver.storage.exists(CHECKPOINT_NAME)
        divergence.log(ctx, err)
        raise
    finally:
        if machine is not None:
            machine.shutdown()
    # the partition of the data this stage saw, as numbers beside its accuracy (the param
    # singa.data_partition says the same in words)
    final = {**last_eval, "data/train_samples": float(sum(part["train_per_group"])), "data/test_samples": float(part["test"]),
             "throughput/images_per_s": (done - first) * images_per_step / max(train_s, 1e-9),
             "time/train_s": train_s, "comm/bytes_per_step": stats["comm_bytes_per_step"],
             "comm/bridge_bytes_per_step": stats["bridge_bytes_per_step"],
             "comm/group_param_bytes_per_step": stats["group_param_bytes_per_step"], "comm/wait_s": stats["comm_s"]}
    if target is not None and "test/accuracy" in last_eval:
        final["test/reached_target"] = float(reached is not None)
        final["test/target_accuracy"] = float(target)
        if reached is not None:
            final["time/to_target_s"] = reached
    final = {prefix + k: v for k, v in final.items()}
    if prefix:  # a pre-training stage's finals are not among the run's returned metrics
        ctx.log_metrics(final)
    return {"final": final, "params": {k: np.array(v) for k, v in params.items()}}


def _local_net(spec: dict, params: dict):
    from workloads.singa.apps import load_dataset
    from workloads.singa.net import NeuralNet

    data = load_dataset(spec["data"], spec.get("data_dir"), spec["seed"], spec["smoke"], spec.get("max_input_mb"))
    net = NeuralNet(spec["layers"], data.shapes(), seed=spec["seed"])
    net.set_params(params, strict=False)
    return net, data


def _test_features(net, data, names: list[str], limit: int | None = None) -> dict[str, np.ndarray]:
    n = data.num_test if limit is None else min(limit, data.num_test)
    out: dict[str, list] = {k: [] for k in names}
    for i in range(0, n, 500):
        batch = {k: torch.as_tensor(v[i:min(i + 500, n)]) for k, v in data.test.items()}
        for k, v in net.features(batch, names).items():
            out[k].append(v.reshape(v.shape[0], -1).numpy().copy())
    return {k: np.concatenate(v) for k, v in out.items()}


def msae_retrieval(spec: dict, params: dict, ctx) -> dict[str, float]:
    """Image->text and text->image retrieval on the test pairs through the latent layers."""
    from workloads.singa.retrieval import mean_average_precision, precision_at_k

    net, data = _local_net(spec, params)
    feats = _test_features(net, data, ["iz", "tz"])
    img, txt, labels = feats["iz"], feats["tz"], data.test["label"]
    metrics = {
        "test/precision_at_10_img2txt": precision_at_k(img, txt, labels, labels, 10),
        "test/precision_at_10_txt2img": precision_at_k(txt, img, labels, labels, 10),
        "test/map_at_50_img2txt": mean_average_precision(img, txt, labels, labels, 50),
        "test/map_at_50_txt2img": mean_average_precision(txt, img, labels, labels, 50),
        "test/precision_at_10_img2img": precision_at_k(img, img, labels, labels, 10),
    }
    if "test_docs" in data.meta:
        # Fig. 11 in text: the 5 nearest tag documents of the first test images.
        lines = []
        for q in range(5):
            order = np.argsort(((txt - img[q]) ** 2).sum(1))[:5]
            lines.append(f"image {q} (class {labels[q]}): " + " | ".join(" ".join(data.meta["test_docs"][j]) for j in order))
        ctx.log_text("\n".join(lines), "tables/msae_img2txt_examples.txt")
    return metrics


def tsne_figures(spec: dict, params: dict, layers: list[str], samples: int, ctx) -> dict[str, float]:
    """Appendix A: one t-SNE figure per layer for ``samples`` test images; returns each layer's
    neighbourhood purity (how well its features cluster by class)."""
    from orchard.figures import pyplot
    from workloads.singa.figures import tsne_figure, tsne_problem
    from workloads.singa.tsne import neighbourhood_purity

    net, data = _local_net(spec, params)
    feats = _test_features(net, data, layers, limit=samples)
    labels = data.test["label"][: len(next(iter(feats.values())))]
    if labels.ndim > 1:
        labels = labels.argmax(1)
    plt, out = pyplot(), {}
    for name, f in feats.items():
        problem = tsne_problem(f)
        if problem is not None:  # a line instead of a figure (or a crash: see tsne_problem)
            print(f"singa: no t-SNE figure of {name}: its features {problem}", flush=True)
            continue
        out[f"tsne/{name}_purity"] = neighbourhood_purity(f, labels)
        fig = tsne_figure(f, labels, f"t-SNE of {name} ({len(f)} test samples; 10-NN class purity "
                          f"{out[f'tsne/{name}_purity']:.2f})", seed=spec["seed"])
        ctx.log_figure(fig, f"figures/tsne_{name}.png")
        plt.close(fig)
    return out
