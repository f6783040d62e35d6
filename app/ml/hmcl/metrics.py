"""Retrieval, classification and drift figures for Lorentz embeddings of paired modalities.

Pure functions over **space components** (the time component is implicit, see ``lorentz.py``);
inputs are numpy arrays or tensors, outputs plain Python floats. Everything is computed in float64:
these figures compare small differences between model versions, and float32 rounding of Lorentz
inner products far from the origin would show up as drift that is not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations, permutations

import numpy as np
import torch
from torch import Tensor

from app.ml.geometry.lorentz import lorentz_distance, pairwise_lorentz_distance, time_component

ArrayLike = np.ndarray | Tensor
DRIFT_MEASURES = ("radial", "angular", "cross_modal", "paired_distance")


def _f64(x: ArrayLike) -> Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x).double()


def paired_recall_at_k(queries: ArrayLike, gallery: ArrayLike, curv: float, k: int = 5) -> float:
    """Fraction of queries i whose partner gallery[i] is among their k nearest gallery items.

    Rank of the partner = number of gallery items strictly closer than it (ties count in the
    query's favour, so an exact duplicate of the partner does not turn a hit into a miss).
    """
    q, g = _f64(queries), _f64(gallery)
    if q.shape != g.shape:
        raise ValueError(f"queries {tuple(q.shape)} and gallery {tuple(g.shape)} must be paired")
    if len(q) == 0:
        raise ValueError("no queries")
    dist = pairwise_lorentz_distance(q, g, curv)
    partner = dist.diagonal()[:, None]
    rank = (dist < partner).sum(dim=1)
    return float((rank < k).double().mean())


def symmetric_recall_at_k(embeddings: Mapping[str, ArrayLike], curv: float, k: int = 5) -> float:
    """Mean of ``paired_recall_at_k`` over every ordered pair of modalities (a→b and b→a)."""
    names = list(embeddings)
    if len(names) < 2:
        raise ValueError("need at least two modalities")
    pairs = list(permutations(names, 2))
    return float(
        np.mean([paired_recall_at_k(embeddings[a], embeddings[b], curv, k) for a, b in pairs])
    )


def nearest_class_accuracy(
    queries: ArrayLike, class_embeddings: ArrayLike, labels: np.ndarray, curv: float
) -> float:
    """Accuracy of assigning each query the class whose (name) embedding is nearest in d_L."""
    dist = pairwise_lorentz_distance(_f64(queries), _f64(class_embeddings), curv)
    predicted = dist.argmin(dim=1).numpy()
    return float(np.mean(predicted == np.asarray(labels)))


@dataclass(frozen=True)
class ClassPairing:
    """A classification-style task: every row of ``class_modality`` repeats one of a few class
    texts (many ``query_modality`` rows ↔ one class row). ``labels[i]`` is row i's class and
    ``class_rows[k]`` a row holding class k's text."""

    class_modality: str
    query_modality: str
    labels: np.ndarray
    class_rows: np.ndarray

    @property
    def classes(self) -> int:
        return len(self.class_rows)


def class_pairing(features: Mapping[str, ArrayLike]) -> ClassPairing | None:
    """The classification-style reading of paired rows, or None for a one-to-one pairing.

    A modality is the class side when its rows take K distinct values with 2 ≤ K ≤ rows / 2
    (on average every class text is paired with at least two rows); of two such modalities the
    one with fewer distinct rows. The query side is the first other modality.
    """
    names = list(features)
    best: ClassPairing | None = None
    for name in names:
        rows = np.asarray(features[name])
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        k = len(first)
        if 2 <= k <= len(rows) // 2 and (best is None or k < best.classes):
            query = next(m for m in names if m != name)
            best = ClassPairing(name, query, inverse.reshape(-1), first)
    return best


def class_accuracy(
    embeddings: Mapping[str, ArrayLike], pairing: ClassPairing, curv: float
) -> float:
    """``nearest_class_accuracy`` of the query rows among the task's distinct class texts, from
    the embeddings of the paired rows (class rows repeated as in the features)."""
    classes = np.asarray(embeddings[pairing.class_modality])[pairing.class_rows]
    return nearest_class_accuracy(embeddings[pairing.query_modality], classes, pairing.labels, curv)


def _normalised_gram(a: Tensor, b: Tensor) -> Tensor:
    """Cosines of the space components: (a/‖a‖)(b/‖b‖)ᵀ (the angle part of the geometry)."""
    # A point at the origin has no direction; the clamp keeps it at cosine 0 instead of NaN.
    an = a / torch.clamp(a.norm(dim=-1, keepdim=True), min=1e-300)
    bn = b / torch.clamp(b.norm(dim=-1, keepdim=True), min=1e-300)
    return an @ bn.T


def drift_measures(
    before: Mapping[str, ArrayLike], after: Mapping[str, ArrayLike], curv: float
) -> dict[str, float]:
    """The four drift measures of HMCL between two embeddings of the same paired items.

    With x the space components and x₀ = sqrt(1/c + ‖x‖²):
    - radial = mean over modalities and items of |Δx₀|;
    - angular = mean over modalities of mean |ΔG| for G = x̂x̂ᵀ within a modality (x̂ = x/‖x‖);
    - cross_modal = the same for the cross block x̂_a x̂_bᵀ, averaged over modality pairs;
    - paired_distance = mean over modality pairs and items of |Δ d(x_a,i, x_b,i)|.
    All four vanish when every modality moves by one shared spatial rotation.
    """
    names = list(before)
    if set(after) != set(names):
        raise ValueError("before and after must hold the same modalities")
    b = {m: _f64(before[m]) for m in names}
    a = {m: _f64(after[m]) for m in names}
    radial = np.mean(
        [float((time_component(a[m], curv) - time_component(b[m], curv)).abs().mean()) for m in b]
    )
    angular = np.mean(
        [
            float((_normalised_gram(a[m], a[m]) - _normalised_gram(b[m], b[m])).abs().mean())
            for m in b
        ]
    )
    pairs = list(combinations(names, 2))
    cross = paired = float("nan")
    if pairs:
        cross = np.mean(
            [
                float((_normalised_gram(a[p], a[q]) - _normalised_gram(b[p], b[q])).abs().mean())
                for p, q in pairs
            ]
        )
        paired = np.mean(
            [
                float(
                    (lorentz_distance(a[p], a[q], curv) - lorentz_distance(b[p], b[q], curv))
                    .abs()
                    .mean()
                )
                for p, q in pairs
            ]
        )
    return {
        "radial": float(radial),
        "angular": float(angular),
        "cross_modal": float(cross),
        "paired_distance": float(paired),
    }
