"""Paired image/text data for the multi-modal stacked auto-encoder (4.3, 6.4).

``digits_tags`` (default, built from what is here): each real scikit-learn digit image
(64 pixels scaled to 0..1) is paired with a short tag document drawn from words that describe
its class (``"seven"``, ``"prime"``, ``"odd"``, ...) plus, with probability 0.3, one random
noise tag, like the user tags of NUS-WIDE; text is a binary bag of words over the vocabulary.
Relevance for retrieval = same class.

``nuswide`` reads real pairs laid out like NUS-WIDE's low-level release, one row per image in
``data_dir``: ``image_features.txt`` (whitespace floats, e.g. the 500-d SIFT BoW),
``tags.txt`` (0/1 per tag of the 1k tag list) and ``labels.txt`` (0/1 per concept);
optional ``split.txt`` ("train"/"test" per row, else the last 20% are the test set).
Two items are relevant when they share a concept.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data import check_input_size, Dataset, MAX_INPUT_MB, stratified_split

CLASS_WORDS = {
    0: ["zero", "nought", "oval", "ring", "even"],
    1: ["one", "single", "stroke", "unit", "odd"],
    2: ["two", "pair", "swan", "prime", "even"],
    3: ["three", "trio", "curly", "prime", "odd"],
    4: ["four", "quad", "angular", "square", "even"],
    5: ["five", "hand", "hook", "prime", "odd"],
    6: ["six", "loop", "belly", "even", "half"],
    7: ["seven", "lucky", "slash", "prime", "odd"],
    8: ["eight", "double", "loop", "snowman", "even"],
    9: ["nine", "balloon", "stick", "square", "odd"],
}
NOISE_WORDS = ["photo", "scan", "ink", "paper", "note", "digit", "number", "sketch", "blur", "mark"]


def vocabulary() -> list[str]:
    words = sorted({w for ws in CLASS_WORDS.values() for w in ws} | set(NOISE_WORDS))
    return words


def make_tags(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[list[str]]]:
    """Binary bag-of-words (N, V) float32 and the words themselves, 2-4 class words per image."""
    vocab = vocabulary()
    index = {w: i for i, w in enumerate(vocab)}
    bow = np.zeros((len(labels), len(vocab)), np.float32)
    docs = []
    for i, c in enumerate(labels):
        words = list(rng.choice(CLASS_WORDS[int(c)], size=rng.integers(2, 5), replace=False))
        if rng.random() < 0.3:
            words.append(str(rng.choice(NOISE_WORDS + vocab)))
        docs.append(words)
        for w in words:
            bow[i, index[w]] = 1.0
    return bow, docs


def load_digit_tags_dataset(data_dir, seed: int, smoke: bool) -> Dataset:
    """``image`` (N, 64) float32 in 0..1, ``text`` (N, V) binary, ``label`` (N,) class ids."""
    from .digits import sklearn_digits

    digits, labels = sklearn_digits()
    images = (digits.reshape(len(digits), -1) / 16.0).astype(np.float32)
    rng = np.random.default_rng(seed)
    text, docs = make_tags(labels, rng)
    train, test = stratified_split(labels, 0.2, seed)
    if smoke:
        train, test = train[:400], test[:150]
    pick = lambda idx: {"image": images[idx], "text": text[idx], "label": labels[idx]}  # noqa: E731
    return Dataset("digits_tags", pick(train), pick(test),
                   {"vocabulary": vocabulary(), "test_docs": [docs[i] for i in test], "relevance": "class"})


def load_nuswide_dataset(data_dir, seed: int, smoke: bool, max_bytes: int = MAX_INPUT_MB * 2**20) -> Dataset:
    """Real image/tag pairs in the NUS-WIDE layout described above; ``label`` is (N, C) 0/1.
    A file over ``max_bytes`` is refused before it is read (``InputTooLarge``)."""
    if data_dir is None:
        raise FileNotFoundError("singa.data=nuswide needs singa.data_dir=<folder>")
    d = Path(data_dir)
    for name in ("image_features.txt", "tags.txt", "labels.txt", "split.txt"):
        if (d / name).is_file():
            check_input_size(d / name, (d / name).stat().st_size, max_bytes)
    image = np.loadtxt(d / "image_features.txt", dtype=np.float32, ndmin=2)
    text = np.loadtxt(d / "tags.txt", dtype=np.float32, ndmin=2)
    concepts = np.loadtxt(d / "labels.txt", dtype=np.int64, ndmin=2)
    if not (len(image) == len(text) == len(concepts)):
        raise ValueError(f"{d}: image_features, tags and labels must have the same number of rows")
    # Features on very different scales would swamp the sigmoid units: scale each to 0..1.
    lo, hi = image.min(0), image.max(0)
    image = (image - lo) / np.where(hi > lo, hi - lo, 1.0)
    if (d / "split.txt").is_file():
        split = np.array((d / "split.txt").read_text().split())
        is_test = split == "test"
    else:
        is_test = np.arange(len(image)) >= int(len(image) * 0.8)
    pick = lambda m: {"image": image[m], "text": text[m], "label": concepts[m]}  # noqa: E731
    return Dataset("nuswide", pick(~is_test), pick(is_test), {"relevance": "shared_concept"})
