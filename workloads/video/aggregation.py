"""The aggregation module: fuse segment-level and stream-level scores on the validation set.

Input: ``scores[stream]`` of shape (V videos, K segments, C classes), softmax
probabilities, and ``labels`` (V,). Methods (the notes' list, minus the TODO-only
Fisher vector / VLAD / compact bilinear pooling):

- ``avg``: mean over segments, then over streams (TSN's default consensus);
- ``max``: max over segments, mean over streams;
- ``topk``: mean of the k largest segment scores per class, mean over streams;
- ``linear``: one weight per stream on segment-averaged scores, fitted on validation;
- ``attention``: a small learned module weighs every (stream, segment) score vector.

The notes fit aggregation "on the validation set" and evaluate it there too; a
fitted method scored on the data it was fitted on flatters itself, so the two
fitted methods are scored by k-fold cross-validation inside the validation set
(fit on k-1 folds, predict the held-out fold) and then refitted on all of it for use.

A fitted method is never worse than the best single stream: where a stream alone
ranks above the method's held-out predictions (``rank_key``), the method falls back
to that stream, in its own parameters (linear: all weight on it; attention: all
attention on its segments), so inference and the logged model use the fallback too.
"""
from __future__ import annotations

import itertools

import numpy as np

METHODS = ("avg", "max", "topk", "linear", "attention")


def _stack(scores: dict[str, np.ndarray]) -> np.ndarray:
    return np.stack([scores[s] for s in sorted(scores)])  # (S, V, K, C)


def pool_avg(scores, **_):
    """(S, V, K, C) -> (V, C)."""
    return scores.mean(axis=2).mean(axis=0)


def pool_max(scores, **_):
    return scores.max(axis=2).mean(axis=0)


def pool_topk(scores, k: int = 3, **_):
    k = max(1, min(k, scores.shape[2]))
    top = np.sort(scores, axis=2)[:, :, -k:, :]
    return top.mean(axis=2).mean(axis=0)


def fit_linear(scores: np.ndarray, labels: np.ndarray, step: float = 0.05) -> np.ndarray:
    """Stream weights (S,) on the simplex (grid of ``step``) minimising the log-loss of the mixture.

    Log-loss, not top-1: on a few videos top-1 is flat over most of the grid and a stream at
    chance can win its ties by luck, while the mixture's log-loss (convex in the weights) grows
    with any weight on a stream that gives the label less mass than the others.
    """
    seg_avg = scores.mean(axis=2)                       # (S, V, C)
    s = seg_avg.shape[0]
    ticks = np.round(np.arange(0, 1 + 1e-9, step), 6)
    best, best_nll = np.full(s, 1.0 / s), np.inf
    for w in itertools.product(ticks, repeat=s - 1):
        if sum(w) > 1 + 1e-9:
            continue
        weights = np.array([*w, max(0.0, 1 - sum(w))])
        fused = np.tensordot(weights, seg_avg, axes=1)  # (V, C)
        nll = float(-np.log(fused[np.arange(len(labels)), labels] + 1e-9).mean())
        if nll < best_nll - 1e-12:
            best, best_nll = weights, nll
    return best


def apply_linear(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.tensordot(weights, scores.mean(axis=2), axes=1)


class AttentionPool:
    """Attention weighting: a tiny MLP scores each (stream, segment) entry from its
    score vector, its entropy and a stream one-hot; softmax over all S*K entries;
    the fused score is the weighted sum. Trained with cross-entropy, seeded, from equal
    attention; ``content_penalty`` (L2 on the weights reading scores and entropy, not the
    one-hot) keeps a few videos from teaching it to trust whatever looks confident (a
    stream at chance often does), so down-weighting a whole stream is the cheap move."""

    def __init__(self, hidden: int = 16, steps: int = 300, lr: float = 0.05, seed: int = 0,
                 content_penalty: float = 0.03):
        self.hidden, self.steps, self.lr, self.seed = hidden, steps, lr, seed
        self.content_penalty = content_penalty
        self.net = None

    def _features(self, scores: np.ndarray):
        import torch

        s, v, k, c = scores.shape
        x = torch.as_tensor(scores, dtype=torch.float32).permute(1, 0, 2, 3).reshape(v, s * k, c)
        entropy = -(x * torch.log(x + 1e-9)).sum(-1, keepdim=True)
        stream = torch.eye(s).repeat_interleave(k, dim=0).expand(v, s * k, s)
        return x, torch.cat([torch.sort(x, dim=-1, descending=True).values, entropy, stream], -1)

    def _fuse(self, scores: np.ndarray, features=None):
        import torch

        x, feats = features or self._features(scores)
        attn = torch.softmax(self.net(feats).squeeze(-1), dim=1)       # (V, S*K)
        return (attn.unsqueeze(-1) * x).sum(1)                          # (V, C)

    def fit(self, scores: np.ndarray, labels: np.ndarray) -> "AttentionPool":
        import torch

        # tensors this small run fastest on one thread: with two on a busy machine, every step's
        # handoff between threads waits for a core (measured on a busy 2-core machine: 150 steps
        # 0.06 s on one thread, 5-17 s on two)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._fit(scores, labels)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, scores: np.ndarray, labels: np.ndarray) -> "AttentionPool":
        import torch
        from torch import nn

        from orchard.api import NumpyOptimizer

        torch.manual_seed(self.seed)
        features = self._features(scores)
        self.net = nn.Sequential(nn.Linear(features[1].shape[-1], self.hidden), nn.Tanh(), nn.Linear(self.hidden, 1))
        with torch.no_grad():  # start from equal attention everywhere (plain averaging), not a random tilt
            self.net[2].weight.zero_()
            self.net[2].bias.zero_()
        # torch.optim.Adam's rule in numpy (orchard's, the parameter servers' own), not torch.optim:
        # a torch optimizer imports torch._dynamo when first used, 1.8-2.7 s of the driver's one
        # core on a 2-core machine, for a fit of a few hundred steps on a few hundred weights
        opt = NumpyOptimizer({"name": "adam", "lr": self.lr})
        params = dict(self.net.named_parameters())
        y = torch.as_tensor(labels, dtype=torch.long)
        content = self.net[0].weight[:, :-scores.shape[0]]  # the columns reading scores and entropy
        for _ in range(self.steps):
            fused = self._fuse(scores, features)
            loss = nn.functional.nll_loss(torch.log(fused + 1e-9), y) + self.content_penalty * (content ** 2).sum()
            self.net.zero_grad()
            loss.backward()
            stepped = opt.apply({n: p.detach().numpy() for n, p in params.items()},
                                {n: p.grad.numpy() for n, p in params.items()})
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(torch.from_numpy(stepped[n]))
        return self

    def predict(self, scores: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self._fuse(scores).numpy()

    def stream_weights(self, scores: np.ndarray) -> np.ndarray:
        """(S,) the attention each stream's segments get, averaged over the videos of ``scores``."""
        import torch

        s, v, k, _ = scores.shape
        with torch.no_grad():
            _, feats = self._features(scores)
            attn = torch.softmax(self.net(feats).squeeze(-1), dim=1)    # (V, S*K)
        return attn.reshape(v, s, k).sum(-1).mean(0).numpy()

    @classmethod
    def on_one_stream(cls, stream: int, streams: int, classes: int, hidden: int = 16) -> "AttentionPool":
        """A pool that attends to one stream's segments only (equally): its segment average.

        The fallback in the module's own parameters: one hidden unit reads that stream's
        one-hot (tanh(1) for its entries, tanh(0) = 0 for the others) and the output scales it
        to a logit of 60, so every other entry's attention is below e^-60.
        """
        import torch
        from torch import nn

        pool = cls(hidden=hidden)
        pool.net = nn.Sequential(nn.Linear(classes + 1 + streams, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        with torch.no_grad():
            for p in pool.net.parameters():
                p.zero_()
            pool.net[0].weight[0, classes + 1 + stream] = 1.0
            pool.net[2].weight[0, 0] = 60.0 / float(np.tanh(1.0))
        return pool


def log_loss(fused: np.ndarray, labels: np.ndarray) -> float:
    """Mean negative log of the label's share of each row (rows renormalised to sum 1).

    Max and top-k pooling do not give probabilities; renormalising puts every
    method on the same scale for the tie-break.
    """
    p = fused / np.maximum(fused.sum(axis=1, keepdims=True), 1e-12)
    return float(-np.log(p[np.arange(len(labels)), labels] + 1e-9).mean())


def rank_key(row: dict) -> tuple:
    """How table rows rank: highest top-1, then top-5, then lowest log-loss (larger key = better).

    Log-loss counts to 6 decimals: a fit that lands on plain averaging (equal weights) computes
    avg's log-loss in float64 instead of float32, and must tie with it, not win by 1e-8.
    """
    return row["top1"], row.get("top5", 0.0), -round(row["log_loss"], 6)


def pick_winner(table: list[dict]) -> str:
    """The winning method: ``rank_key``, then METHODS order.

    Explicit so that a tie (e.g. every method at top-1 1.00) has a reason: the
    method whose scores put the most mass on the right class wins, and an exact
    tie goes to the earlier, simpler method.
    """
    rows = [r for r in table if r["method"] in METHODS]
    return max(rows, key=lambda r: (*rank_key(r), -METHODS.index(r["method"])))["method"]


def topk_accuracy(fused: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of rows whose label is among the ``k`` highest scores."""
    top = np.argsort(-fused, axis=1)[:, :k]
    return float((top == labels[:, None]).any(axis=1).mean())


def _folds(labels: np.ndarray, n_folds: int, seed: int) -> list[np.ndarray]:
    """Stratified folds: each class's videos dealt round-robin after a seeded shuffle, the deal
    going on from class to class (with one video per class, restarting at fold 0 for each
    class put every video in fold 0 and left nothing to fit on)."""
    rng = np.random.default_rng(seed)
    fold_of = np.zeros(len(labels), int)
    dealt = 0
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        rng.shuffle(members)
        fold_of[members] = (dealt + np.arange(len(members))) % n_folds
        dealt += len(members)
    return [np.flatnonzero(fold_of == f) for f in range(n_folds)]


def cross_validated(fit_predict, scores: np.ndarray, labels: np.ndarray, n_folds: int,
                    seed: int) -> np.ndarray | None:
    """Held-out predictions (V, C) from k-fold fitting inside the validation set; None with
    fewer than 2 videos (nothing to fit on once one is held out)."""
    if len(labels) < 2:
        return None
    out = np.zeros(scores.shape[1:2] + scores.shape[3:])
    n_folds = max(2, min(n_folds, len(labels)))
    for held in _folds(labels, n_folds, seed):
        train = np.setdiff1d(np.arange(len(labels)), held)
        out[held] = fit_predict(scores[:, train], labels[train], scores[:, held])
    return out


def _row(method: str, fused: np.ndarray, labels: np.ndarray, num_classes: int) -> dict:
    row = {"method": method, "top1": topk_accuracy(fused, labels, 1)}
    if num_classes > 5:
        row["top5"] = topk_accuracy(fused, labels, 5)
    row["log_loss"] = log_loss(fused, labels)
    return row


def evaluate(scores: dict[str, np.ndarray], labels: np.ndarray, topk: int = 3, n_folds: int = 4,
             seed: int = 0, attention_steps: int = 300) -> dict:
    """Score every method; returns ``{"table", "winner", "fitted", "fallbacks", "learned", "streams", "fused"}``.

    ``table`` rows: ``{"method", "top1", "top5"?, "log_loss"}`` (top-5 only with more
    than 5 classes), plus one ``<stream>_only`` row per stream (segment average) for
    reference. The fitted methods' rows also carry ``fallback`` (None or ``"<stream>_only"``)
    and ``fitted_top1`` / ``fitted_top5`` / ``fitted_log_loss``: their held-out figures before
    any fallback. ``fitted``: what ``fuse`` applies (the fallback included); ``fallbacks``:
    method -> None or ``"<stream>_only"``; ``learned``: what the fits found on all of the
    validation set, before any fallback (``linear_weights``, ``attention_stream_weights``);
    ``fused``: method -> the (V, C) scores the table scored. The winner follows ``pick_winner``.
    """
    stacked = _stack(scores)
    streams = sorted(scores)
    labels = np.asarray(labels)
    num_classes = stacked.shape[-1]
    fused = {"avg": pool_avg(stacked), "max": pool_max(stacked), "topk": pool_topk(stacked, k=topk)}
    fit_predict = {
        "linear": lambda s, y, h: apply_linear(h, fit_linear(s, y)),
        "attention": lambda s, y, h: AttentionPool(steps=attention_steps, seed=seed).fit(s, y).predict(h),
    }
    singles = {f"{stream}_only": stacked[i].mean(1) for i, stream in enumerate(streams)}
    single_rows = [_row(name, f, labels, num_classes) for name, f in singles.items()]
    best_single = max(single_rows, key=rank_key)
    table, fallbacks = [], {}
    for name in METHODS:
        if name not in fit_predict:
            table.append(_row(name, fused[name], labels, num_classes))
            continue
        held_out = cross_validated(fit_predict[name], stacked, labels, n_folds, seed)
        # the fit against the streams alone, on held-out videos only (a single stream fits nothing);
        # with nothing held out (one video) the fit is unproven and the best stream stands in for it
        row = _row(name, held_out, labels, num_classes) if held_out is not None else None
        fallbacks[name] = best_single["method"] if row is None or rank_key(best_single) > rank_key(row) else None
        fitted_figures = {f"fitted_{k}": v for k, v in (row or {}).items() if k != "method"}
        if fallbacks[name]:
            fused[name] = singles[fallbacks[name]]
            row = {**best_single, "method": name}
        else:
            fused[name] = held_out
        table.append({**row, "fallback": fallbacks[name], **fitted_figures})
    winner = pick_winner(table)
    table += single_rows

    # refitted on all of the validation set for inference; a fallback in the method's own parameters
    weights = fit_linear(stacked, labels)
    attention = AttentionPool(steps=attention_steps, seed=seed).fit(stacked, labels)
    learned = {"linear_weights": dict(zip(streams, weights.tolist())),
               "attention_stream_weights": dict(zip(streams, attention.stream_weights(stacked).tolist()))}
    if fallbacks["linear"]:
        weights = np.eye(len(streams))[streams.index(fallbacks["linear"][:-len("_only")])]
    if fallbacks["attention"]:
        attention = AttentionPool.on_one_stream(streams.index(fallbacks["attention"][:-len("_only")]),
                                                len(streams), num_classes, hidden=attention.hidden)
    fitted = {"linear_weights": dict(zip(streams, weights.tolist())), "attention": attention}
    return {"table": table, "winner": winner, "fitted": fitted, "fallbacks": fallbacks, "learned": learned,
            "streams": streams, "fused": fused}


def fuse(method: str, scores: dict[str, np.ndarray], fitted: dict, topk: int = 3) -> np.ndarray:
    """Apply one method (with the weights fitted on validation) to new scores -> (V, C)."""
    stacked = _stack(scores)
    if method == "avg":
        return pool_avg(stacked)
    if method == "max":
        return pool_max(stacked)
    if method == "topk":
        return pool_topk(stacked, k=topk)
    if method == "linear":
        return apply_linear(stacked, np.array([fitted["linear_weights"][s] for s in sorted(scores)]))
    if method == "attention":
        return fitted["attention"].predict(stacked)
    raise ValueError(f"unknown aggregation {method!r}; known: {METHODS}")
