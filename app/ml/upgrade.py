"""A backbone upgrade as the service runs it: split, train, and measure against the alternatives.

``run_backbone_upgrade`` holds out ``eval_fraction`` of the paired items, trains the requested
method on the rest, and reports on the held-out items the trained model's compatibility metrics
next to those of the ``procrustes`` adapter fitted on the same split (the simple alternative every
user should see the gain over) and of the ``independent`` model (the reference for P_com/P_up).
Without labels the report gives neighbour recall@10 instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from app.ml.compat import (
    BACKBONE_METHODS,
    LABELLED_ONLY_METHODS,
    CompatParams,
    train_compatible_model,
)
from app.ml.metrics import neighbour_recall, p_com, p_up, retrieval_metrics
from app.ml.models import EmbeddingModel
from app.ml.space import EuclideanLift
from app.ml.training import NO_HOOKS, TrainingHooks

__all__ = [
    "BACKBONE_METHODS",
    "QueryLog",
    "UpgradeData",
    "UpgradeOutcome",
    "check_backbone_request",
    "run_backbone_upgrade",
    "split_for_evaluation",
]

MIN_EVAL_ITEMS = 10
NEIGHBOUR_K = 10


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
    the dataset's logged queries when it has any."""

    new_features: np.ndarray  # N×D float32
    old_vectors: np.ndarray  # N×d float32, in the old gallery's own Euclidean space
    labels: np.ndarray | None = None  # N int64 class codes, or None
    queries: QueryLog | None = None

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


@dataclass
class UpgradeOutcome:
    model: EmbeddingModel
    report: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)


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


def check_backbone_request(
    method: str,
    params: dict[str, Any] | None,
    n_items: int,
    eval_fraction: float,
    seed: int,
    labelled: bool,
) -> dict[str, str]:
    """Everything ``run_backbone_upgrade`` would refuse, found before any training: a map from
    the offending request field (``method``, ``params``, ``eval_fraction``, ``dataset_id``) to
    the reason; empty when the request is acceptable."""
    problems: dict[str, str] = {}
    if method not in BACKBONE_METHODS:
        problems["method"] = f"unknown method {method!r}, expected one of {list(BACKBONE_METHODS)}"
    try:
        compat = CompatParams.from_dict(params)
    except ValueError as exc:
        problems["params"] = str(exc)
        compat = None
    if not 0.0 < eval_fraction < 1.0:
        problems["eval_fraction"] = "eval_fraction must lie strictly between 0 and 1"
    else:
        try:
            split_for_evaluation(n_items, eval_fraction, seed)
        except ValueError as exc:
            problems["dataset_id"] = str(exc)
    if not labelled:
        if method in LABELLED_ONLY_METHODS:
            problems["method"] = f"method {method!r} needs labels"
        elif compat is not None and compat.uncertainty == "knn":
            problems["params"] = "uncertainty 'knn' needs labels; use 'auto', 'norm' or 'none'"
    return problems


def _json_float(value: float) -> float | None:
    """Reports are JSON: a ratio with a zero denominator is reported as null, not NaN."""
    return value if math.isfinite(value) else None


def _labelled_report(
    models: dict[str, EmbeddingModel],
    new_eval: np.ndarray,
    old_eval: np.ndarray,
    labels: np.ndarray,
    curv: float,
) -> dict[str, Any]:
    old_old = retrieval_metrics(old_eval, old_eval, labels, curv).as_dict()
    embedded = {name: model.embed(new_eval) for name, model in models.items()}
    ind = embedded["independent"]
    ind_ind = retrieval_metrics(ind, ind, labels, curv).as_dict()
    report: dict[str, Any] = {"old_old": old_old}
    for name, emb in embedded.items():
        new_old = retrieval_metrics(emb, old_eval, labels, curv).as_dict()
        new_new = retrieval_metrics(emb, emb, labels, curv).as_dict()
        report[name] = {
            "new_old": new_old,
            "new_new": new_new,
            "p_com": {
                k: _json_float(_ratio(p_com, new_old[k], old_old[k], ind_ind[k])) for k in new_old
            },
            "p_up": {k: _json_float(_ratio(p_up, new_new[k], ind_ind[k])) for k in new_new},
        }
    return report


def _ratio(fn, *args: float) -> float:
    try:
        return fn(*args)
    except ZeroDivisionError:
        return float("nan")


def run_backbone_upgrade(
    method: str,
    data: UpgradeData,
    lift: EuclideanLift,
    *,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    eval_fraction: float = 0.2,
    hooks: TrainingHooks = NO_HOOKS,
) -> UpgradeOutcome:
    """Train ``method`` on a seeded split and report held-out compatibility metrics.

    The returned model is trained on the training part only, so the report measures exactly the
    model that gets served. Raises ``ValueError`` for a bad method, parameters or data, and
    ``TrainingCancelled`` when ``hooks.should_stop()`` turns true.
    """
    if method not in BACKBONE_METHODS:
        raise ValueError(f"unknown method {method!r}, expected one of {list(BACKBONE_METHODS)}")
    compat_params = CompatParams.from_dict(params)
    if data.old_vectors.shape[1] < 1:
        raise ValueError("old vectors must have at least one dimension")
    train_idx, eval_idx = split_for_evaluation(len(data), eval_fraction, seed)
    old_points = lift(torch.from_numpy(data.old_vectors)).numpy()
    labels = data.labels
    train_labels = None if labels is None else labels[train_idx]
    if train_labels is not None:
        # Class codes must be dense for the prototype layer: re-index what the split kept.
        _, train_labels = np.unique(train_labels, return_inverse=True)

    def train(name: str, stage_hooks: TrainingHooks) -> EmbeddingModel:
        return train_compatible_model(
            name,
            data.new_features[train_idx],
            old_points[train_idx],
            train_labels,
            lift.curv,
            compat_params,
            seed=seed,
            hooks=stage_hooks,
        )

    model = train(method, hooks)
    quiet = TrainingHooks(should_stop=hooks.should_stop)
    references: dict[str, EmbeddingModel] = {method: model}
    if method != "procrustes":
        references["procrustes"] = train("procrustes", quiet)

    new_eval, old_eval = data.new_features[eval_idx], old_points[eval_idx]
    report: dict[str, Any] = {
        "method": method,
        "n_train": int(train_idx.size),
        "n_eval": int(eval_idx.size),
        "labelled": labels is not None,
    }
    if labels is not None:
        if method != "independent":
            references["independent"] = train("independent", quiet)
        report["metrics"] = _labelled_report(
            references, new_eval, old_eval, labels[eval_idx], lift.curv
        )
    else:
        k = min(NEIGHBOUR_K, eval_idx.size - 1)
        report["metrics"] = {
            name: {
                f"neighbour_recall@{k}": neighbour_recall(m.embed(new_eval), old_eval, lift.curv, k)
            }
            for name, m in references.items()
        }
    return UpgradeOutcome(model=model, report=report, params=compat_params.to_dict())
