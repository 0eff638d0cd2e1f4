"""singa's evaluation beyond the per-epoch test pass (train.fit): a trained net's features on the
test set (``features_of_test_set``); the MSAE's cross-modal retrieval (4.3, 6.4: queries of one modality
ranked against the latent features of the other by Euclidean distance, ``msae_retrieval``); how
well a layer's features cluster by class (Appendix A, ``neighbourhood_purity``; the t-SNE picture
is in figures.py)."""
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


def neighbourhood_purity(features: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """Share of each point's k nearest neighbours (in feature space) with its class: how well a
    layer's features cluster by semantics, the quantity Fig. 15 shows by eye."""
    from sklearn.neighbors import NearestNeighbors

    x = features.reshape(len(features), -1)
    idx = NearestNeighbors(n_neighbors=k + 1).fit(x).kneighbors(x, return_distance=False)[:, 1:]
    return float((labels[idx] == labels[:, None]).mean())


def local_net(spec: dict, params: dict):
    """The net of ``spec`` with ``params``, in this process, and its dataset."""
    from .data import load_dataset
    from .model import NeuralNet

    data = load_dataset(spec["data"], spec.get("data_dir"), spec["seed"], spec["smoke"], spec.get("max_input_mb"))
    net = NeuralNet(spec["layers"], data.shapes(), seed=spec["seed"])
    net.set_params(params, strict=False)
    return net, data


def features_of_test_set(net, data, names: list[str], limit: int | None = None) -> dict[str, np.ndarray]:
    """The features (N, D) of layers ``names`` on the first ``limit`` test samples (all: None)."""
    import torch

    n = data.num_test if limit is None else min(limit, data.num_test)
    out: dict[str, list] = {k: [] for k in names}
    for i in range(0, n, 500):
        batch = {k: torch.as_tensor(v[i:min(i + 500, n)]) for k, v in data.test.items()}
        for k, v in net.features(batch, names).items():
            out[k].append(v.reshape(v.shape[0], -1).numpy().copy())
    return {k: np.concatenate(v) for k, v in out.items()}


def msae_retrieval(spec: dict, params: dict, ctx) -> dict[str, float]:
    """Image->text and text->image retrieval on the test pairs through the latent layers."""
    net, data = local_net(spec, params)
    feats = features_of_test_set(net, data, ["iz", "tz"])
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
