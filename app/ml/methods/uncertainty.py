"""Uncertainty of old embeddings, which sets how hard HBCT's alignment pulls toward each one.

- ``norm`` (the paper, *reconstructed*): u = 1 − tanh(√c‖log₀ h‖) — points near the origin are
  vague. For an external gallery of unit vectors lifted at one scale it is constant: no signal.
- ``knn`` (calibrated): the fraction of the item's k nearest old neighbours that carry another
  label — directly the old model's local error rate around the item. Needs labels.
- ``none``: zero everywhere, so RINCE reduces to plain InfoNCE.
- ``auto``: ``knn`` when labels are given, ``norm`` otherwise.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor

from app.ml.evaluation.metrics import ranked_neighbours
from app.ml.geometry.lorentz import uncertainty as norm_uncertainty

UncertaintySource = Literal["norm", "knn", "none"]
UNCERTAINTY_SOURCES: tuple[str, ...] = ("auto", "norm", "knn", "none")
DEFAULT_KNN_K = 10


def knn_uncertainty(
    old_points: Tensor, labels: np.ndarray, curv: float, k: int = DEFAULT_KNN_K
) -> Tensor:
    """1 − (share of the k nearest other old points with the item's label)."""
    labels = np.asarray(labels)
    neighbours = ranked_neighbours(
        old_points.detach().cpu().numpy(), old_points.detach().cpu().numpy(), curv, k=k
    )
    agreement = (labels[neighbours] == labels[:, None]).mean(axis=1)
    return torch.as_tensor(1.0 - agreement, dtype=old_points.dtype)


def old_uncertainty(
    source: str,
    old_points: Tensor,
    curv: float,
    labels: np.ndarray | None = None,
    k: int = DEFAULT_KNN_K,
) -> Tensor:
    """Per-item uncertainty in [0, 1] of the old embeddings, by ``source``."""
    if source == "auto":
        source = "norm" if labels is None else "knn"
    if source == "norm":
        return norm_uncertainty(old_points, curv)
    if source == "knn":
        if labels is None:
            raise ValueError("uncertainty 'knn' needs labels; use 'norm' or 'none' without them")
        return knn_uncertainty(old_points, labels, curv, k)
    if source == "none":
        return torch.zeros(old_points.shape[0], dtype=old_points.dtype)
    raise ValueError(
        f"unknown uncertainty source {source!r}, expected one of {UNCERTAINTY_SOURCES}"
    )
