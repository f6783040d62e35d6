"""What a backbone upgrade consumes and returns: paired items, logged queries, the outcome, and
the seeded splits of items and queries into training and held-out parts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.ml.methods.models import EmbeddingModel

MIN_EVAL_ITEMS = 10
# The gallery's items without dataset features that an upgrade's held-out searches score as
# distractors, at most (a seeded sample beyond, and the report says so): 100,000 old vectors of
# 768 dims are 300 MiB, and every held-out query is scored against each of them.
MAX_DISTRACTORS = 100_000


@dataclass
class QueryLog:
    """Logged queries of one dataset: the new backbone's features for each query, optionally the
    same queries embedded by the old model, and optionally the rows of ``UpgradeData`` (the
    paired gallery items) each query is about. At least one of the two optional parts is set."""

    features: np.ndarray  # Q×D float32, the new backbone (same D as UpgradeData.new_features)
    old_vectors: np.ndarray | None = None  # Q×d float32, the old model's own Euclidean space
    relevant: list[np.ndarray] | None = None  # per query: int64 row indices into UpgradeData

    def __post_init__(self) -> None:
        self.features = np.asarray(self.features, dtype=np.float32)
        if self.features.ndim != 2:
            raise ValueError("query features must be a 2-d array")
        if self.old_vectors is None and self.relevant is None:
            raise ValueError("a query log needs old_vectors, relevant, or both")
        if self.old_vectors is not None:
            self.old_vectors = np.asarray(self.old_vectors, dtype=np.float32)
            if self.old_vectors.shape[0] != self.features.shape[0]:
                raise ValueError("query old_vectors need one row per query")
        if self.relevant is not None:
            self.relevant = [np.asarray(r, dtype=np.int64).reshape(-1) for r in self.relevant]
            if len(self.relevant) != self.features.shape[0]:
                raise ValueError("query relevant lists need one entry per query")

    def __len__(self) -> int:
        return self.features.shape[0]


@dataclass
class UpgradeData:
    """Paired rows: the user's new-backbone features and the same items' old embeddings, and
    the dataset's logged queries when it has any.

    ``distractors``: the gallery's other stored items (no new features in the dataset) by their
    old vectors. They train nothing; the held-out query figures search them beside the paired
    items, in the old space, as a user's search of the gallery would meet them. None: none
    given (a benchmark's data, a gallery the dataset covers), and the figures search the paired
    items alone. ``unpaired_total``: how many such items the gallery holds when
    ``distractors`` is a sample of them (``MAX_DISTRACTORS``); None when it is all of them."""

    new_features: np.ndarray  # N×D float32
    old_vectors: np.ndarray  # N×d float32, in the old gallery's own Euclidean space
    labels: np.ndarray | None = None  # N int64 class codes, or None
    queries: QueryLog | None = None
    distractors: np.ndarray | None = None  # M×d float32, the old vectors of unpaired items
    unpaired_total: int | None = None

    def __post_init__(self) -> None:
        self.new_features = np.asarray(self.new_features, dtype=np.float32)
        self.old_vectors = np.asarray(self.old_vectors, dtype=np.float32)
        if self.new_features.ndim != 2 or self.old_vectors.ndim != 2:
            raise ValueError("new_features and old_vectors must be 2-d arrays")
        if self.new_features.shape[0] != self.old_vectors.shape[0]:
            raise ValueError("new_features and old_vectors need one row per item each")
        if self.labels is not None:
            self.labels = np.asarray(self.labels, dtype=np.int64)
            if self.labels.shape != (self.new_features.shape[0],):
                raise ValueError("labels need one entry per item")
        if self.distractors is not None:
            self.distractors = np.asarray(self.distractors, dtype=np.float32)
            if self.distractors.ndim != 2 or self.distractors.shape[1] != self.old_vectors.shape[1]:
                raise ValueError("distractors need the dimension of the old vectors")
        if self.unpaired_total is not None and self.unpaired_total < self.n_distractors:
            raise ValueError("unpaired_total cannot be below the distractors given")
        if self.queries is not None:
            n = self.new_features.shape[0]
            if self.queries.features.shape[1] != self.new_features.shape[1]:
                raise ValueError("query features need the dimension of the item features")
            old = self.queries.old_vectors
            if old is not None and old.shape[1] != self.old_vectors.shape[1]:
                raise ValueError("query old_vectors need the dimension of the old vectors")
            for rows in self.queries.relevant or []:
                if rows.size and (rows.min() < 0 or rows.max() >= n):
                    raise ValueError("query relevant rows must index the paired items")

    def __len__(self) -> int:
        return self.new_features.shape[0]

    @property
    def n_distractors(self) -> int:
        return 0 if self.distractors is None else int(self.distractors.shape[0])

    @property
    def n_unpaired(self) -> int:
        """Unpaired items the gallery holds (the distractors given, or all of them when those
        are a sample)."""
        return self.n_distractors if self.unpaired_total is None else self.unpaired_total


@dataclass
class UpgradeOutcome:
    model: EmbeddingModel
    report: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    # The method actually served: the request's, or for ``auto`` the chosen candidate's.
    method: str = ""


def split_for_evaluation(n: int, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded permutation: the last ``eval_fraction`` of it is held out."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError("eval_fraction must lie strictly between 0 and 1")
    n_eval = math.floor(n * eval_fraction)
    if n_eval < MIN_EVAL_ITEMS or n - n_eval < 2:
        raise ValueError(
            f"{n} items are too few for eval_fraction={eval_fraction}: need ≥ {MIN_EVAL_ITEMS} "
            "held-out items and ≥ 2 training items"
        )
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[: n - n_eval]), np.sort(perm[n - n_eval :])


def split_queries(
    queries: QueryLog | None, eval_idx: np.ndarray, eval_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(training queries, held-out queries) as query indices. A query with relevant items is
    held out iff its first relevant row is a held-out item (so no held-out item's query trains
    the model); the others split by a seeded permutation, ``eval_fraction`` held out."""
    if queries is None:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    n = len(queries)
    relevant = queries.relevant or [np.zeros(0, dtype=np.int64)] * n
    held_items = np.zeros(int(eval_idx.max(initial=-1)) + 1, dtype=bool)
    held_items[eval_idx] = True
    with_rel = np.array([i for i in range(n) if relevant[i].size], dtype=np.int64)
    held = np.array(
        [i for i in with_rel if relevant[i][0] < held_items.size and held_items[relevant[i][0]]],
        dtype=np.int64,
    )
    without = np.array([i for i in range(n) if not relevant[i].size], dtype=np.int64)
    perm = np.random.default_rng([seed, 2]).permutation(without)
    n_held = math.floor(without.size * eval_fraction)
    held_out = np.sort(np.concatenate([held, perm[without.size - n_held :]]))
    train = np.setdiff1d(np.arange(n, dtype=np.int64), held_out)
    return train, held_out
