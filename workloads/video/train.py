"""Two-stream training: one Ray Train run per stream for the whole training, fed by one pipeline.

Each stream trains under the ring strategy (``orchard.strategies.launch``: TorchTrainer +
DDP) with its own worker count, all streams at the same time; its workers run
stream_worker.py's ``train_loop``.  The driver's side is here: ``launch_streams`` starts the
groups, ``train_epochs`` deals the epochs, scores each stream's state on the validation segments
while training goes on, checkpoints, and shifts workers between the streams
(``shift_workers``) when one lags.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

import numpy as np

from orchard.api import background, Diverged, divergence

from .stream_worker import train_loop

log = logging.getLogger(__name__)


def stream_channels(feature: str, stack: int, options: dict, size: int) -> int:
    """Input channels of a stream's CNN for ``feature``."""
    from .extractors import output_shape

    return output_shape(feature, stack, size, **(options.get(feature) or {}))[0]


def trainer_cpus(cfg: dict, stream: str) -> float:
    """The CPU share of each of ``stream``'s Ray Train workers: ``video.cpus_per_worker`` by
    stream, else ``strategy.cpus_per_worker``."""
    share = (cfg["video"].get("cpus_per_worker") or {}).get(stream)
    return float(cfg["strategy"].get("cpus_per_worker", 1) if share is None else share)


def shift_workers(alloc: dict[str, int], val_loss: dict[str, float], ratio: float,
                  min_workers: int) -> tuple[dict[str, int], str]:
    """The notes' dynamic allocation, evaluated between epochs.

    If the worst stream's validation loss exceeds the best one's by more than
    ``ratio`` (e.g. 1.2 = 20 %), the lagging stream takes one worker from the
    leading one, as long as the leader keeps ``min_workers``. Returns the new
    allocation and a one-line reason.
    """
    worst = max(val_loss, key=val_loss.get)
    best = min(val_loss, key=val_loss.get)
    if worst == best or val_loss[worst] <= ratio * val_loss[best]:
        return dict(alloc), "balanced: no shift"
    if alloc[best] - 1 < min_workers:
        return dict(alloc), f"{worst} lags but {best} is at its minimum"
    new = dict(alloc)
    new[best] -= 1
    new[worst] += 1
    return new, f"{worst} lags ({val_loss[worst]:.3f} vs {val_loss[best]:.3f}): one worker from {best}"


def launch_streams(streams: dict[str, dict], alloc: dict[str, int], queues: dict[str, list], results,
                   cfg: dict, ctx, resumed: dict | None = None, generation: int = 0) -> dict:
    """Start one Ray Train run per stream (threads on the driver); returns ``stream -> Future``.

    Each run lasts the whole training (or until a worker shift relaunches it); ``alloc[stream]``
    workers read ``queues[stream]``. ``resumed`` (checkpoint.load_checkpoint, or the driver's
    latest states when a shift relaunches a stream): every stream starts from its state there,
    at the epoch after that one. ``generation`` > 0 names a relaunched stream's Train run apart
    from the run before it (a new run, not a restart of the old one).
    """
    from orchard.api import launch

    vcfg = cfg["video"]

    def one(stream: str):
        spec = streams[stream]
        # strategy.min_workers: each stream's group elastic between it and its own count
        stream_cfg = {**cfg, "strategy": {**cfg["strategy"], "num_workers": alloc[stream],
                                          "cpus_per_worker": trainer_cpus(cfg, stream)}}
        loop_config = {
            "stream": stream, "feature": spec["feature"], "in_channels": spec["in_channels"],
            "num_classes": spec["num_classes"], "widths": vcfg["widths"], "dropout": vcfg["dropout"],
            "optimizer": dict(vcfg["optimizer"]), "seed": int(cfg["seed"]), "epochs": int(vcfg["epochs"]),
            "queues": queues[stream], "results": results,
        }
        if resumed is not None:
            loop_config |= {"state": resumed["states"][stream], "first_epoch": int(resumed["epoch"]) + 1,
                            "first_step": int(resumed["steps"].get(stream, 0))}
        return launch(train_loop, loop_config, stream_cfg, ctx, name=f"{stream}-{generation}" if generation else stream)

    return {s: background.start(one, s, name=f"video-train-{s}") for s in streams}


# --------------------------------------------------------------------------- the driver's epoch loop
@dataclass
class Trained:
    """What the epochs leave (``train_epochs``): the streams' last validated states, their eval
    models scored on the validation set, the allocation history and the counters run.py reports."""
    states: dict[str, bytes]
    steps: dict[str, int]
    history: list[dict]            # per epoch: workers, val loss, the shift rule's verdict
    waits: dict[str, list[float]]  # per stream: its trainers' wait fraction, epoch by epoch
    models: dict
    scores: dict[str, np.ndarray]  # per stream (V, K, C) validation probabilities
    labels: np.ndarray
    val: dict[str, float]          # val/<stream>_loss and val/<stream>_top1
    epochs_run: int
    time_to_target: float | None
    shifts_applied: int
    shift_wait_s: float
    whole_training: dict[str, float]   # the pipeline's busy fractions and rates over the whole training
    t_train: float                 # perf_counter() when training began
    # the rows that came after the last epoch (``after_segments``); None where the pipeline did not
    # run out (training stopped early, or nothing to train): inference decodes them on its own
    after: dict | None = None
    after_s: float = 0.0           # seconds from the first of those rows' arrival to the last's


def train_epochs(cfg: dict, ctx, *, index, train_ids: list[int], streams: dict, features: list[str], count: int,
                 master, cache, val_data: dict | None, val_segments: list[dict], after_segments: list[dict],
                 after_columns: list[str], resumed: dict | None, first_epoch: int, cache_totals: dict,
                 phase_s: dict) -> Trained:
    """Every epoch after ``first_epoch``: the master's segment seeds through one pipeline, the
    feeder dealing it to one Ray Train run per stream. Two kinds of segments ride that pipeline
    and are set aside for the driver (one Ray Data execution, its actor pools started once):
    with ``val_data`` None, the ``val_segments``, ahead of epoch 0; and the ``after_segments``
    (inference windows: ``after_columns`` kept), after the last epoch. ``index`` holds the videos
    of both. After each epoch the driver validates the
    streams' states (``evaluate.score_states``), applies the notes' worker-shift rule, writes the
    epoch's checkpoint and logs its metrics; a met ``video.target_top1`` stops training early.
    Adds to ``cache_totals`` and ``phase_s`` (``train``, ``val``) in place."""
    import ray

    from .aggregation import topk_accuracy
    from .cache import accumulate
    from .checkpoint import save_checkpoint
    from .data import segment_dataset
    from .evaluate import in_val_order, score_states, val_columns
    from .feeder import AFTER, AHEAD, Feeder
    from .pipeline import block_size, stage_metrics
    from .queues import make_queues, shutdown_queues, start_hub

    # the master draws each epoch's class-balanced segment seeds (a pure function of the seed
    # and the epoch); one pipeline carries them all. A resumed run draws only the epochs after
    # its checkpoint's: no epoch is trained twice
    vcfg, epochs, num_classes = cfg["video"], int(cfg["video"]["epochs"]), len(index.classes)
    alloc = dict(resumed["alloc"]) if resumed else {s: int(n) for s, n in vcfg["workers"].items()}
    history = list(resumed["history"]) if resumed else []
    states: dict[str, bytes] = dict(resumed["states"]) if resumed else {}
    steps: dict[str, int] = dict(resumed["steps"]) if resumed else {}
    history_waits = {s: list(w) for s, w in resumed["waits"].items()} if resumed else {}
    train_stats: dict[str, dict] = {}   # every stage's counters over the whole training
    epochs_run, time_to_target = first_epoch, None
    shifts_applied, shift_wait_s = 0, 0.0   # worker shifts applied (video.shift_apply), and their cost
    target = vcfg.get("target_top1")
    after, after_s = None, 0.0
    t_train = time.perf_counter()
    if first_epoch < epochs:
        # the validation segments first (every row carries both columns: Ray Data's blocks share one schema)
        segments = [] if val_data is not None else [{**seg, "epoch": AHEAD} for seg in val_segments]
        for epoch in range(first_epoch, epochs):
            drawn = ray.get(master.epoch_segments.remote(train_ids, int(vcfg["clips_per_epoch"]), count, epoch,
                                                         int(vcfg["offset_stride"])))
            segments += [{**seg, "epoch": epoch, "segment": -1} for seg in drawn]
        segments += [{**seg, "epoch": AFTER} for seg in after_segments]
        # no select_columns: its projection is a 1-CPU Ray Data task of its own, which a cluster
        # whose CPUs the streams and pools hold never schedules (the run stalls); the feeder
        # takes only the columns it deals
        # blocks sized for an epoch (the feeder's pass), not the whole run: an epoch's first rows
        # arrive after one block per decode actor
        block = block_size(int(vcfg["clips_per_epoch"]), vcfg, count)
        train_ds = segment_dataset(segments, features, index, vcfg, master, cache, block=block)
        hub = start_hub()   # one actor holds every queue of the run (queues.py)
        queues = make_queues(alloc, int(vcfg["queue_depth"]), hub)
        results = make_queues({"results": 1}, 0, hub)["results"][0]
        feeder = Feeder({s: spec["feature"] for s, spec in streams.items()}, queues, int(vcfg["batch_size"]), epochs,
                        first_epoch=first_epoch, master=master if vcfg.get("pause_decode", True) else None,
                        aside={**({AHEAD: val_columns(features)} if val_data is None else {}),
                               **({AFTER: after_columns} if after_segments else {})})

        # one Ray Train run per stream for the whole training, the feeder dealing them the pipeline
        t_window = time.perf_counter()
        feeding = feeder.start(train_ds.iter_batches(batch_size=block, batch_format="numpy"))
        runs = launch_streams(streams, alloc, queues, results, cfg, ctx, resumed)
        done: dict[int, dict] = {}
        shift: dict | None = None   # a worker shift the feeder applies from shift["epoch"] on
        generation = 0              # relaunches so far: each relaunched Train run gets a new name
        try:
            for epoch in range(first_epoch, epochs):
                while len(done.get(epoch, {})) < len(streams):
                    item = _next_result(results, runs, feeder)
                    if "diverged" in item:   # a stream's loss or weights went non-finite: the run ends
                        raise _diverged(item, ctx)
                    done.setdefault(item["epoch"], {})[item["stream"]] = item
                for s, item in done[epoch].items():
                    states[s], steps[s] = item["state"], int(item["steps"])
                    history_waits.setdefault(s, []).append(item["metrics"][f"pipeline/{s}_trainer_wait_fraction"])
                window = time.perf_counter() - t_window
                t_window = time.perf_counter()
                stats = ray.get(master.stage_stats.remote(True))
                accumulate(cache_totals, stats)
                _merge_stats(train_stats, stats)
                pipe = stage_metrics(stats, window)
                # validation per stream (the trainers go on with the next epoch meanwhile)
                t_val = time.perf_counter()
                if val_data is None:   # passed ahead of epoch 0: here once a stream has trained it
                    val_data = in_val_order(feeder.set_aside())
                models, scores, labels, losses, val = score_states(states, streams, val_data, num_classes, vcfg)
                phase_s["val"] += time.perf_counter() - t_val
                # the notes' rule, evaluated every epoch; applied (video.shift_apply) from the next
                # epoch the feeder has not begun to deal, else logged only (docs/video.md)
                proposed, reason = shift_workers(alloc, losses, float(vcfg["shift_ratio"]), int(vcfg["min_workers"]))
                if vcfg.get("shift_apply") and proposed != alloc and shift is None:
                    changed = {s: n for s, n in proposed.items() if n != alloc[s]}
                    at = feeder.request_resize(changed)
                    if at is not None:
                        shift = {"epoch": at, "alloc": changed}
                        reason += f"; applied from epoch {at + 1}"
                history.append({"epoch": epoch, "workers": dict(alloc), "val_loss": losses, "shift_rule": reason})
                epochs_run = epoch + 1
                fused = topk_accuracy(np.mean([scores[s].mean(1) for s in streams], axis=0), labels, 1)
                met = target is not None and fused >= target
                # the epoch's checkpoint in the run storage, before its metrics: an epoch whose
                # figures are logged is one a resume will not train again (checkpoint.py)
                save_checkpoint(ctx.storage, epoch, states, steps, alloc, history, history_waits,
                                training_done=met or epoch + 1 == epochs)
                clips = len(streams) * int(vcfg["clips_per_epoch"])
                ctx.log_metrics({**pipe, **val, **{f"pipeline/{s}_workers": n for s, n in alloc.items()},
                                 "pipeline/feeder_wait_pipeline_s": feeder.wait_pipeline_s,
                                 "pipeline/feeder_wait_trainers_s": feeder.wait_trainers_s,
                                 "pipeline/decode_pauses": float(feeder.pauses),
                                 "pipeline/decode_paused_s": feeder.paused_s,
                                 "throughput/pipeline_clips_per_s": clips / max(window, 1e-9),
                                 "time/epoch_s": window}, step=epoch)
                ctx.progress(epoch + 1, epochs, desc=f"epoch {epoch + 1}",
                             **{f"{s} val top1": val[f"val/{s}_top1"] for s in streams})
                if met and epoch + 1 < epochs:
                    # target met: the master stops decoding (the stages drop what is left) and
                    # the trainers stop at their next batch; the last validated states are kept
                    time_to_target = time.perf_counter() - t_train
                    ray.get(master.stop.remote())
                    feeder.finish.set()
                    break
                if met and time_to_target is None:
                    time_to_target = time.perf_counter() - t_train
                if shift is not None and shift["epoch"] == epoch + 1:
                    # the shifted streams' runs end at the feeder's resize mark after this
                    # epoch; relaunch them with their new worker counts from its states
                    generation += 1
                    new_queues = _relaunch_shifted(shift["alloc"], streams, alloc, runs, queues, results,
                                                   states, steps, epoch, int(vcfg["queue_depth"]), cfg, ctx,
                                                   generation)
                    feeder.hand_over(new_queues)
                    shifts_applied, shift = shifts_applied + 1, None
            for s, fut in runs.items():
                fut.result()
            # the rows after the last epoch, whole once the pipeline ran out; none after a stop at the
            # target, whose dropped seeds may be among them even if the pipeline ran out before the
            # feeder heard of the stop (inference then decodes its windows on its own)
            if after_segments and epochs_run == epochs:
                after = feeder.set_aside(AFTER)
                after_s = feeder.aside_seconds(AFTER) if after is not None else 0.0
                stats = ray.get(master.stage_stats.remote(True))   # what the stages did after the last epoch's window
                accumulate(cache_totals, stats)
                _merge_stats(train_stats, stats)
        finally:
            feeder.stop.set()
            if any(not f.done() for f in runs.values()) or feeder.error:
                try:   # unblock trainers of a failed or interrupted run; never mask why it stopped
                    shutdown_queues({**queues, "results": [results]})
                except Exception as exc:
                    log.warning("video: queues not shut down cleanly: %s", exc)
                # the streams' Train runs end once their queues are gone (train.py's workers
                # return); the run lifecycle waits for their threads before Ray stops
                # (orchard/background.py)
            wait_futures([feeding], timeout=30)  # the lifecycle waits for it too, before Ray stops
            shift_wait_s = feeder.resize_wait_s
        shutdown_queues({**queues, "results": [results]})
    else:
        # resumed after its last epoch (stopped in aggregation or inference): nothing to train,
        # the checkpointed states go on to aggregation and inference
        models, scores, labels, losses, val = score_states(states, streams, val_data, num_classes, vcfg)
    phase_s["train"] = time.perf_counter() - t_train
    # the pipeline runs ahead of the epochs (bounded by the queues): its busy fractions over the
    # whole training say more than per-epoch windows in which it may have had nothing left to do
    whole_training = {k.replace("pipeline/", "pipeline/train_", 1): v
                      for k, v in stage_metrics(train_stats, phase_s["train"]).items()
                      if k.endswith(("_busy_fraction", "_items_per_s", "frames_per_s"))}
    if first_epoch < epochs:
        whole_training |= ray.get(master.gate_callers.remote())
    return Trained(states, steps, history, history_waits, models, scores, labels, val, epochs_run, time_to_target,
                   shifts_applied, shift_wait_s, whole_training, t_train, after, after_s)


def _relaunch_shifted(changed: dict[str, int], streams: dict, alloc: dict, runs: dict, queues: dict, results,
                      states: dict, steps: dict, epoch: int, depth: int, cfg: dict, ctx, generation: int) -> dict:
    """Wait for the shifted streams' runs to end (at their resize mark), then start each again
    with its new worker count from its state after ``epoch``; updates ``alloc``, ``runs`` and
    ``queues`` in place and returns the new queues for the feeder."""
    from .queues import make_queues, shutdown_queues

    old = [runs[s] for s in changed]
    background.wait(old)
    for fut in old:
        fut.result()  # a run that failed instead of ending at the mark fails the run here
    shutdown_queues({s: queues[s] for s in changed})
    alloc.update(changed)
    new_queues = make_queues(changed, depth, hub=results.hub)
    queues.update(new_queues)
    resumed = {"states": states, "steps": steps, "epoch": epoch}
    runs.update(launch_streams({s: streams[s] for s in changed}, alloc, new_queues, results, cfg, ctx, resumed,
                               generation=generation))
    return new_queues


def _next_result(results, runs: dict, feeder) -> dict:
    """The next end-of-epoch state from a stream's rank 0; raises if a run or the feeder failed."""
    from ray.util.queue import Empty

    while True:
        try:
            return results.get(block=True, timeout=1.0)
        except Empty:
            pass
        if feeder.error is not None:
            raise RuntimeError(f"video pipeline failed: {type(feeder.error).__name__}: {feeder.error}") \
                from feeder.error
        for fut in runs.values():
            if fut.done():
                fut.result()   # raises the run's error, if it failed
        if all(fut.done() for fut in runs.values()):
            try:   # handed over just before its run ended (a stream that diverged)
                return results.get(block=False)
            except Empty:
                raise RuntimeError("the streams' training ended before handing over every epoch") from None


def _diverged(item: dict, ctx):
    """The run's ``Diverged`` from a stream's hand-over (``train_loop``), ``train/diverged_at_step``
    logged; its ``checkpoint`` says whether an epoch's checkpoint (all finite) is there to resume."""
    from .checkpoint import CHECKPOINT_NAME

    err = Diverged(**item["diverged"])
    err.checkpoint = ctx.storage.exists(CHECKPOINT_NAME)
    divergence.log(ctx, err)
    return err


def _merge_stats(total: dict, window: dict) -> None:
    """Add one window's per-stage counters (master.stage_stats) into ``total``."""
    for stage, st in window.items():
        acc = total.setdefault(stage, {"actors": 0})
        for k, v in st.items():
            if k == "actors":
                acc["actors"] = max(acc["actors"], v)
            elif isinstance(v, (int, float)) and k not in ("first", "last"):
                acc[k] = acc.get(k, 0) + v


def wait_fractions(waits: dict[str, list[float]]) -> dict[str, float]:
    """Each stream's trainer wait fraction over the epochs: its mean and its worst epoch (the
    target is < 10% in every epoch, docs/video.md); the per-epoch values are the series
    ``pipeline/<stream>_trainer_wait_fraction``."""
    out = {}
    for s, v in waits.items():
        if v:
            out[f"pipeline/{s}_trainer_wait_fraction_mean"] = float(np.mean(v))
            out[f"pipeline/{s}_trainer_wait_fraction_max"] = float(np.max(v))
    return out
