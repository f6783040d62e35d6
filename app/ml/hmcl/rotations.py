"""Rotations between continual model versions: the orthogonal Procrustes fit y_new ≈ R·y_parent
over every old row (exact from the stored second moments), its residual, and the chain that
brings a newer version's queries into an ancestor gallery's frame (a spatial rotation is a
Lorentz isometry, so no gallery vector is touched)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class OutputMoments:
    """Σ y_new y_oldᵀ, Σ‖y_old‖², Σ‖y_new‖² over every old row of every modality, from the
    lifted second moments alone: y = Wz ⇒ Σ y_new y_oldᵀ = Σ_m W_newᵐ (Σ z zᵀ) W_oldᵐᵀ."""

    cross: Tensor
    old_sq: float
    new_sq: float

    @classmethod
    def of(
        cls,
        old_heads: Mapping[str, Tensor],
        new_heads: Mapping[str, Tensor],
        second_moments: Mapping[str, Tensor],
    ) -> OutputMoments:
        dim = next(iter(new_heads.values())).shape[0]
        cross = torch.zeros(dim, dim, dtype=torch.float64)
        old_sq = new_sq = 0.0
        for name, moment in second_moments.items():
            w_old, w_new = old_heads[name].double(), new_heads[name].double()
            m_old = moment.double() @ w_old.T  # (D+1)×d, shared by two of the three sums
            cross += w_new @ m_old
            old_sq += float((w_old.T * m_old).sum())
            new_sq += float(((w_new @ moment.double()) * w_new).sum())
        return cls(cross, old_sq, new_sq)

    def procrustes(self) -> Tensor:
        """Orthogonal R = argmin Σ‖y_new − R y_old‖² = U Vᵀ for Σ y_new y_oldᵀ = U Σ Vᵀ."""
        u, _, vt = torch.linalg.svd(self.cross)
        return u @ vt

    def relative_residual(self, rotation: Tensor) -> float:
        """sqrt(Σ‖y_new − R y_old‖² / Σ‖y_old‖²) for orthogonal R: what R leaves unexplained.

        Σ‖y_new − R y_old‖² = Σ‖y_new‖² + Σ‖y_old‖² − 2 tr(Rᵀ Σ y_new y_oldᵀ).
        """
        if self.old_sq <= 0.0:
            return 0.0
        resid = (
            self.new_sq + self.old_sq - 2.0 * float(torch.trace(rotation.double().T @ self.cross))
        )
        # Rounding can make a perfect fit's residual slightly negative.
        return math.sqrt(max(resid, 0.0) / self.old_sq)


def fit_shared_rotation(
    old_heads: Mapping[str, Tensor],
    new_heads: Mapping[str, Tensor],
    second_moments: Mapping[str, Tensor],
) -> Tensor:
    """Orthogonal Procrustes over all modalities' old rows, from the moments: y_new ≈ R y_old."""
    return OutputMoments.of(old_heads, new_heads, second_moments).procrustes()


def rotation_residual(
    rotation: Tensor,
    old_heads: Mapping[str, Tensor],
    new_heads: Mapping[str, Tensor],
    second_moments: Mapping[str, Tensor],
) -> float:
    """sqrt(Σ‖y_new − R y_old‖² / Σ‖y_old‖²) over the old rows (see ``OutputMoments``)."""
    return OutputMoments.of(old_heads, new_heads, second_moments).relative_residual(rotation)


def accumulated_rotation(rotations_since_parent: Sequence[np.ndarray]) -> np.ndarray:
    """R_j ⋯ R_{i+1} for rotations listed oldest first ([R_{i+1}, …, R_j]): frame i → frame j."""
    if not rotations_since_parent:
        raise ValueError("need at least one rotation (pass the identity for no change)")
    total = np.eye(np.asarray(rotations_since_parent[0]).shape[0])
    for rot in rotations_since_parent:
        rot = np.asarray(rot, dtype=np.float64)
        if rot.shape != total.shape:
            raise ValueError(f"rotation of shape {rot.shape}, expected {total.shape}")
        if not np.allclose(rot @ rot.T, np.eye(len(rot)), atol=1e-5):
            raise ValueError("rotations must be orthogonal")
        total = rot @ total
    return total


def map_query_to_ancestor(
    query: np.ndarray, rotations_since_parent: Sequence[np.ndarray]
) -> np.ndarray:
    """Bring queries embedded by version j into the frame of a gallery built by ancestor i < j.

    ``rotations_since_parent`` = [R_{i+1}, …, R_j], each version's recorded rotation since its
    parent (y_k ≈ R_k y_{k−1}); the query's space components map by q_i = (R_j ⋯ R_{i+1})ᵀ q_j,
    the time component is unchanged (a spatial rotation is a Lorentz isometry). An empty list
    (i = j) returns the query as is.
    """
    q = np.asarray(query, dtype=np.float64)
    if not rotations_since_parent:
        return q.astype(np.asarray(query).dtype, copy=True)
    total = accumulated_rotation(rotations_since_parent)
    if q.shape[-1] != total.shape[0]:
        raise ValueError(f"query dimension {q.shape[-1]} does not match rotations {total.shape}")
    # Row vectors: (Tᵀ q)ᵀ = qᵀ T.
    return (q @ total).astype(np.asarray(query).dtype)
