"""singa's training: the stages of a net (CD pre-training of each RBM, then BP) and each stage's
epochs under the architecture (``fit``): the worker groups and parameter servers are Ray actors
(architectures.py, worker_group.py) that run the steps; this loop drives their rounds, evaluates
every epoch, checkpoints (checkpoint.py) and rebuilds them after a lost node.  Called by run.py."""
from __future__ import annotations

import math
import time

import numpy as np
import ray

from orchard.api import Diverged, divergence, word

from .checkpoint import CHECKPOINT_NAME, finite, restore_point, stage_start
from .settings import group_spec


def train_stages(cfg: dict, ctx, app: dict, train: dict, arch: dict, resumed: dict | None, initial: dict | None,
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
                  start_epoch=stage_start(resumed, i), saver=saver.for_stage(i, initial),
                  lr=_lr_advice(cfg, arch, stage_train["updater"], pretrain_stage=i), rebuilds=rebuilds)
        initial = {**(initial or {}), **out["params"]}
        final.update({k: v for k, v in out["final"].items() if "recon_error" in k})
    # [2] BP training (or fine-tuning from the RBM weights)
    spec = group_spec(cfg, app, train, arch)
    spec["initial_params"] = initial
    out = fit(spec, arch, cfg, ctx, int(train["epochs"]), target=train.get("target_accuracy"),
              start_epoch=stage_start(resumed, len(pretrain)), saver=saver.for_stage(len(pretrain), initial),
              lr=_lr_advice(cfg, arch, train["updater"]), rebuilds=rebuilds)
    final.update(out["final"])
    return initial, out, spec


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


def _rebuild(arch: dict, spec: dict, cfg: dict, bound_s: float):
    """The architecture again on the nodes alive, with the CPUs they have. Tried again while Ray
    still places a group on the node going away (its start is cancelled), up to ``bound_s``."""
    from orchard.api import NotPlaced
    from .architectures import Architecture

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


def _after_lost_node(lost, arch: dict, spec: dict, cfg: dict, ctx, rebuilds, saver, start_epoch: int, prefix: str,
                     bound_s: float):
    """A group or server went with its node: the lost architecture abandoned, the same groups
    built again on the nodes alive from the stage's last checkpoint, the restart logged.
    Returns the new architecture and the epoch it goes on from."""
    lost.abandon()
    epoch, params = restore_point(saver, start_epoch, spec.get("initial_params"))
    machine = _rebuild(arch, {**spec, "initial_params": params}, cfg, bound_s)
    ctx.log_metrics({"train/restarts": rebuilds.restarts, prefix + "train/resumed_from_epoch": epoch,
                     "train/group_nodes": len(set(machine.nodes))}, step=rebuilds.restarts)
    return machine, epoch


def fit(spec: dict, arch: dict, cfg: dict, ctx, epochs: int, target: float | None, prefix: str = "",
        start_epoch: int = 0, saver=None, lr: dict | None = None, rebuilds=None) -> dict:
    """Run epochs ``start_epoch + 1 .. epochs`` of ``spec`` under ``arch``; evaluate after every
    epoch; ``saver(epoch, epochs, params_fn)`` checkpoints.  A NaN or infinite training loss (or
    non-finite weights at a checkpoint) raises ``Diverged`` naming ``lr`` (``_lr_advice``): the
    last checkpoint stays the last finite one (orchard/run/divergence.py).

    ``rebuilds`` (``node_loss.Rebuilds``): a group or server lost with its node ends the round;
    the architecture is built again on the nodes alive (the same groups, with the CPUs left)
    from the stage's last checkpoint, up to ``strategy.max_failures`` times."""
    from .architectures import Architecture
    from orchard.api import start_bound_s

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
                    saver(epoch, epochs, lambda: finite(machine.params(), epoch, done, lr))
            except Diverged:
                raise
            except Exception as exc:  # noqa: BLE001 - a lost node is rebuilt after; anything else raises
                if rebuilds is None or not rebuilds.recoverable(exc, mark):
                    raise
                # [lost a node] the same groups again on the nodes alive, from the last checkpoint
                lost, machine = machine, None  # nothing of it to shut down if the new one cannot start
                machine, epoch = _after_lost_node(lost, arch, spec, cfg, ctx, rebuilds, saver, start_epoch, prefix, bound)
                done, mark = epoch * spe, rebuilds.started()
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
             "time/train_s": train_s, "wire/bytes_per_step": stats["comm_bytes_per_step"],
             "wire/bridge_bytes_per_step": stats["bridge_bytes_per_step"],
             "wire/group_param_bytes_per_step": stats["group_param_bytes_per_step"], "time/comm_wait_s": stats["comm_s"]}
    if target is not None and "test/accuracy" in last_eval:
        final["test/reached_target"] = float(reached is not None)
        final["test/target_accuracy"] = float(target)
        if reached is not None:
            final["time/to_target_s"] = reached
    final = {prefix + k: v for k, v in final.items()}
    if prefix:  # a pre-training stage's finals are not among the run's returned metrics
        ctx.log_metrics(final)
    return {"final": final, "params": {k: np.array(v) for k, v in params.items()}}


