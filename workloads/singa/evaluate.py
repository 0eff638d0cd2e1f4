"""Cross-modal retrieval metrics for the MSAE (4.3, 6.4): queries of one modality ranked
against the latent features of the other by Euclidean distance."""
from __future__ import annotations

import numpy as np


def relevance(labels_q: np.ndarray, labels_db: np.ndarray) -> np.ndarray:
    """(Q, N) bool: same class (1-d labels) or at least one shared concept (2-d 0/1 labels)."""
    if labels_q.ndim == 1:
        return labels_q[:, None] == labels_db[None, :]
    return (labels_q @ labels_db.T) > 0


def precision_at_k(query: np.ndarray, database: np.ndarray, labels_q: np.ndarray, labels_db: np.ndarray,
                   k: int = 10) -> float:
    """Mean over queries of the share of relevant items among the k nearest in ``database``."""
    d = ((query[:, None, :] - database[None, :, :]) ** 2).sum(-1)
    top = np.argsort(d, axis=1)[:, :k]
    rel = relevance(labels_q, labels_db)
    return float(np.take_along_axis(rel, top, axis=1).mean())


def mean_average_precision(query, database, labels_q, labels_db, k: int = 50) -> float:
    """MAP@k, the measure of the MSAE paper (Wang et al. 2014)."""
    d = ((query[:, None, :] - database[None, :, :]) ** 2).sum(-1)
    top = np.argsort(d, axis=1)[:, :k]
    rel = np.take_along_axis(relevance(labels_q, labels_db), top, axis=1).astype(np.float64)
    hits = np.cumsum(rel, axis=1)
    prec = hits / np.arange(1, k + 1)
    ap = (prec * rel).sum(1) / np.maximum(rel.sum(1), 1)
    return float(ap.mean())
