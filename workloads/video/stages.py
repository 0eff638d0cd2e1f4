"""Ray Data stages: the decode worker and one stage per feature extractor.

Each stage is a callable class run as an actor pool (``ActorPoolStrategy(min, max)``:
Ray Data grows and shrinks the pool with the backlog, the notes' elastic
"expand or shrink"). A stage reports its per-batch counters to the master
(items, busy seconds, bytes out, cache hits) so the run can show per-stage
throughput and the cache's time saved.
"""
from __future__ import annotations

import time

import numpy as np

from .cache import FeatureCache, cache_key
from .decoder import BadVideo, build_decoder
from .extractors import build_extractor, extract_many, load_modules


def _actor_id() -> str:
    import ray

    return ray.get_runtime_context().get_actor_id() or "driver"


def _report(master, stage: str, items: int, busy_s: float, bytes_out: int, cache: FeatureCache,
            **extra: float) -> None:
    if master is None:
        return
    master.report.remote(stage, _actor_id(), items, busy_s, bytes_out, hits=cache.hits,
                         misses=cache.misses, saved_s=cache.saved_s, **extra)
    cache.reset_counters()  # counters travel as deltas


class DecodeStage:
    """Segment seeds in (video, label, offset, count[, segment]); frames (N, T, H, W, 3) uint8 out.

    The seeds come through the master's release gate (pipeline.release_segments: a pause holds
    them back before this stage); each batch is reported back to it (``flow``: this dataset),
    which lets the next seeds in. A segment whose file fails to decode is dropped, counted and
    named to the master: one bad file never stops the pipeline.
    """

    def __init__(self, paths: list[str], lengths: list[int], size: int, short_rule: str,
                 decoder: str, master=None, cache: FeatureCache | None = None, pts: list | None = None,
                 digests: list[str] | None = None, flow: str = "", extract: list[dict] | None = None):
        self.paths, self.lengths, self.size, self.short_rule = paths, lengths, size, short_rule
        # fused (pipeline.fused): the feature stages run here, on the frames this actor decoded,
        # and only their features leave it: no frames through the object store, one pool to size
        self.extract = [ExtractStage(**kwargs) for kwargs in extract or []]
        self.pts = pts or [None] * len(paths)          # frame index per video (dataset.scan)
        self.digests = digests or paths                # content address per video (cache keys)
        self.decoder = build_decoder(decoder, size=size, short_rule=short_rule)
        self.master, self.flow = master, flow
        self.cache = cache or FeatureCache("none")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            out = self._decode(batch)
            for stage in self.extract:
                out = stage(out)
            return out
        finally:
            if self.master is not None:   # done with these seeds, decoded or not: the gate may let more in
                self.master.decoded.remote(self.flow, len(batch["video"]))

    def _decode(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch["video"])
        t0 = time.perf_counter()
        t = int(batch["count"][0]) if n else 0
        # one contiguous array for the batch, filled in place: what leaves the actor is this block
        frames = np.empty((n, t, self.size, self.size, 3), np.uint8)
        keep, bad, todo = np.ones(n, bool), 0, {}
        keys = [cache_key(self.digests[int(v)], int(off), int(cnt), self.size, "frames", self.short_rule)
                for v, off, cnt in zip(batch["video"], batch["offset"], batch["count"])]
        for i in range(n):
            clip = self.cache.get(keys[i])
            if clip is None:
                todo.setdefault(int(batch["video"][i]), []).append(i)
            else:
                frames[i] = clip
        for v, rows in todo.items():   # the batch's clips of one video: one pass over its file
            for i, clip, seconds in self._decode_video(v, [(int(batch["offset"][i]), t) for i in rows], rows):
                if clip is None:
                    keep[i], bad = False, bad + 1
                    continue
                frames[i] = clip
                self.cache.put(keys[i], clip, seconds)
        out = {k: v[keep] for k, v in batch.items()}
        out["frames"] = frames if keep.all() else frames[keep]
        _report(self.master, "decode", int(keep.sum()), time.perf_counter() - t0, out["frames"].nbytes,
                self.cache, frames=float(keep.sum() * t), bad=float(bad))
        return out

    def _decode_video(self, v: int, requests: list[tuple[int, int]], rows: list[int]):
        """``(row, clip or None, seconds)`` for each request on video ``v``. A file that fails in the
        shared pass is decoded clip by clip, so that only the clips it cannot give are dropped."""
        path = self.paths[v]
        t1 = time.perf_counter()
        try:
            clips = self.decoder.decode_many(path, requests, length=self.lengths[v], pts=self.pts[v])
            per = (time.perf_counter() - t1) / len(rows)
            return [(i, clip, per) for i, clip in zip(rows, clips)]
        except BadVideo:
            pass
        got = []
        for i, (off, cnt) in zip(rows, requests):
            t1 = time.perf_counter()
            try:
                got.append((i, self.decoder.decode(path, off, cnt, length=self.lengths[v], pts=self.pts[v]),
                            time.perf_counter() - t1))
            except BadVideo as exc:
                got.append((i, None, 0.0))
                if self.master is not None:
                    self.master.bad_file.remote(path, str(exc))
        return got


class ExtractStage:
    """Frames in; adds the column ``name`` (one feature per clip). Drops the frames when last.

    Only the features a stream needs are computed, and with ``drop_frames`` only
    they travel on to the trainer (the notes' transmission argument).
    """

    def __init__(self, name: str, options: dict, stack: int, paths: list[str], size: int,
                 master=None, cache: FeatureCache | None = None, drop_frames: bool = True,
                 modules: list[str] | None = None, digests: list[str] | None = None):
        load_modules(modules)   # video.extractor_modules: a user's extractors register here, in the actor
        self.name, self.paths, self.size = name, paths, size
        self.digests = digests or paths
        self.extractor = build_extractor(name, stack=stack, **options)
        self.options = ",".join(f"{k}={v}" for k, v in sorted(options.items())) + f",stack={stack}"
        self.master, self.drop_frames = master, drop_frames
        self.cache = cache or FeatureCache("none")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        frames = batch["frames"]
        keys = [cache_key(self.digests[int(v)], int(off), int(cnt), self.size, self.name, self.options)
                for v, off, cnt in zip(batch["video"], batch["offset"], batch["count"])]
        feats = [self.cache.get(key) for key in keys]   # one decoded clip feeds every feature stage
        todo = [i for i, feat in enumerate(feats) if feat is None]
        if todo:   # the block's misses at once: what overlapping clips share is computed once
            t1 = time.perf_counter()
            made = extract_many(self.extractor, [frames[i] for i in todo])
            per_clip = (time.perf_counter() - t1) / len(todo)
            for i, feat in zip(todo, made):
                feats[i] = feat
                self.cache.put(keys[i], feat, per_clip)
        out = dict(batch)
        if self.drop_frames:
            del out["frames"]
        if feats:
            out[self.name] = np.stack(feats)
        else:
            shape = self.extractor(np.zeros((frames.shape[1] or 1, self.size, self.size, 3), np.uint8)).shape
            out[self.name] = np.zeros((0, *shape), np.uint8)
        _report(self.master, self.name, len(feats), time.perf_counter() - t0, out[self.name].nbytes,
                self.cache)
        return out
