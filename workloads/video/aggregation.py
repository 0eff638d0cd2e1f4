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
    """Stream weights on the simplex (grid of ``step``) maximising top-1, ties by log-loss."""
    seg_avg = scores.mean(axis=2)                       # (S, V, C)
    s = seg_avg.shape[0]
    ticks = np.round(np.arange(0, 1 + 1e-9, step), 6)
    best, best_key = np.full(s, 1.0 / s), None
    for w in itertools.product(ticks, repeat=s - 1):
        if sum(w) > 1 + 1e-9:
            continue
        weights = np.array([*w, 1 - sum(w)])
        fused = np.tensordot(weights, seg_avg, axes=1)  # (V, C)
        acc = float((fused.argmax(1) == labels).mean())
        nll = float(-np.log(fused[np.arange(len(labels)), labels] + 1e-9).mean())
        key = (acc, -nll)
        if best_key is None or key > best_key:
            best, best_key = weights, key
    return best


def apply_linear(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.tensordot(weights, scores.mean(axis=2), axes=1)


class AttentionPool:
    """Attention weighting: a tiny MLP scores each (stream, segment) entry from its
    score vector, its entropy and a stream one-hot; softmax over all S*K entries;
    the fused score is the weighted sum. Trained with cross-entropy, seeded."""

    def __init__(self, hidden: int = 16, steps: int = 300, lr: float = 0.05, seed: int = 0):
        self.hidden, self.steps, self.lr, self.seed = hidden, steps, lr, seed
        self.net = None

    def _features(self, scores: np.ndarray):
        import torch

        s, v, k, c = scores.shape
        x = torch.as_tensor(scores, dtype=torch.float32).permute(1, 0, 2, 3).reshape(v, s * k, c)
        entropy = -(x * torch.log(x + 1e-9)).sum(-1, keepdim=True)
        stream = torch.eye(s).repeat_interleave(k, dim=0).expand(v, s * k, s)
        return x, torch.cat([torch.sort(x, dim=-1, descending=True).values, entropy, stream], -1)

    def _fuse(self, scores: np.ndarray):
        import torch

        x, feats = self._features(scores)
        attn = torch.softmax(self.net(feats).squeeze(-1), dim=1)       # (V, S*K)
        return (attn.unsqueeze(-1) * x).sum(1)                          # (V, C)

    def fit(self, scores: np.ndarray, labels: np.ndarray) -> "AttentionPool":
        import torch
        from torch import nn

        torch.manual_seed(self.seed)
        _, feats = self._features(scores)
        self.net = nn.Sequential(nn.Linear(feats.shape[-1], self.hidden), nn.Tanh(), nn.Linear(self.hidden, 1))
        opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)
        y = torch.as_tensor(labels, dtype=torch.long)
        for _ in range(self.steps):
            fused = self._fuse(scores)
            loss = nn.functional.nll_loss(torch.log(fused + 1e-9), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return self

    def predict(self, scores: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self._fuse(scores).numpy()


def log_loss(fused: np.ndarray, labels: np.ndarray) -> float:
    """Mean negative log of the label's share of each row (rows renormalised to sum 1).

    Max and top-k pooling do not give probabilities; renormalising puts every
    method on the same scale for the tie-break.
    """
    p = fused / np.maximum(fused.sum(axis=1, keepdims=True), 1e-12)
    return float(-np.log(p[np.arange(len(labels)), labels] + 1e-9).mean())


def pick_winner(table: list[dict]) -> str:
    """The winning method: highest top-1, then top-5, then lowest log-loss, then METHODS order.

    Explicit so that a tie (e.g. every method at top-1 1.00) has a reason: the
    method whose scores put the most mass on the right class wins, and an exact
    tie goes to the earlier, simpler method.
    """
    rows = [r for r in table if r["method"] in METHODS]
    return max(rows, key=lambda r: (r["top1"], r.get("top5", 0.0), -r["log_loss"],
                                    -METHODS.index(r["method"])))["method"]


def topk_accuracy(fused: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of rows whose label is among the ``k`` highest scores."""
    top = np.argsort(-fused, axis=1)[:, :k]
    return float((top == labels[:, None]).any(axis=1).mean())


def _folds(labels: np.ndarray, n_folds: int, seed: int) -> list[np.ndarray]:
    """Stratified folds: each class's videos dealt round-robin after a seeded shuffle."""
    rng = np.random.default_rng(seed)
    fold_of = np.zeros(len(labels), int)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        rng.shuffle(members)
        fold_of[members] = np.arange(len(members)) % n_folds
    return [np.flatnonzero(fold_of == f) for f in range(n_folds)]


def cross_validated(fit_predict, scores: np.ndarray, labels: np.ndarray, n_folds: int, seed: int):
    """Held-out predictions (V, C) from k-fold fitting inside the validation set."""
    out = np.zeros(scores.shape[1:2] + scores.shape[3:])
    n_folds = max(2, min(n_folds, len(labels)))
    for held in _folds(labels, n_folds, seed):
        if len(held) == 0:
            continue
        train = np.setdiff1d(np.arange(len(labels)), held)
        if len(train) == 0:  # too few videos to hold any out: fall back to plain averaging
            out[held] = pool_avg(scores[:, held])
            continue
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
    """Score every method; returns ``{"table": [...], "winner": name, "fitted": {...}, "fused": {...}}``
    (``fused``: method -> the (V, C) scores the table scored, cross-validated for fitted methods).

    ``table`` rows: ``{"method", "top1", "top5"?, "log_loss"}`` (top-5 only with more
    than 5 classes), plus one ``<stream>_only`` row per stream (segment average) for
    reference. The winner follows ``pick_winner``.
    """
    stacked = _stack(scores)
    labels = np.asarray(labels)
    num_classes = stacked.shape[-1]
    fused = {
        "avg": pool_avg(stacked),
        "max": pool_max(stacked),
        "topk": pool_topk(stacked, k=topk),
        "linear": cross_validated(lambda s, y, h: apply_linear(h, fit_linear(s, y)), stacked, labels,
                                  n_folds, seed),
        "attention": cross_validated(
            lambda s, y, h: AttentionPool(steps=attention_steps, seed=seed).fit(s, y).predict(h),
            stacked, labels, n_folds, seed),
    }
    table = []
    for name, f in fused.items():
        table.append(_row(name, f, labels, num_classes))
    winner = pick_winner(table)
    for i, stream in enumerate(sorted(scores)):
        table.append(_row(f"{stream}_only", stacked[i].mean(1), labels, num_classes))
    fitted = {"linear_weights": dict(zip(sorted(scores), fit_linear(stacked, labels).tolist())),
              "attention": AttentionPool(steps=attention_steps, seed=seed).fit(stacked, labels)}
    return {"table": table, "winner": winner, "fitted": fitted, "streams": sorted(scores), "fused": fused}


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
