"""Compatibility metrics (BCT / FCT / HBCT lineage), computed exactly in float64.

M(q, g) is a retrieval metric with queries embedded by q and the gallery by g; the evaluation set
serves as both query and gallery, each query's own item excluded; relevance = same label. All
embeddings are space components of points in one Lorentz frame, ranked by Lorentz distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import spearmanr

from app.ml.geometry.lorentz import pairwise_lorentz_inner

DEFAULT_MAP_DEPTH = 100


@dataclass(frozen=True)
class RetrievalMetrics:
    cmc1: float  # fraction of queries whose nearest other item shares their label
    map_at_k: float  # mAP over the top-k, normalised by the relevant items found there
    map_full: float | None = None  # mAP over the whole ranked gallery, when asked for

    def as_dict(self) -> dict[str, float]:
        out = {"cmc1": self.cmc1, "map": self.map_at_k}
        if self.map_full is not None:
            out["map_full"] = self.map_full
        return out


def ranked_neighbours(
    queries: np.ndarray,
    gallery: np.ndarray,
    curv: float,
    k: int | None = None,
    exclude_self: bool = True,
    chunk: int = 1024,
) -> np.ndarray:
    """Indices of each query's gallery items by increasing Lorentz distance (float64).

    Ranks by the Lorentz inner product, which the distance acosh(−c⟨x,y⟩_L)/√c decreases in:
    the same order without an acosh per pair. With ``exclude_self`` the gallery is the query set
    itself and item i is dropped from row i. ``k=None`` ranks the whole gallery.
    """
    q = torch.as_tensor(queries, dtype=torch.float64)
    g = torch.as_tensor(gallery, dtype=torch.float64)
    n_gallery = g.shape[0] - (1 if exclude_self else 0)
    depth = n_gallery if k is None else min(k, n_gallery)
    out = np.empty((q.shape[0], depth), dtype=np.int64)
    for start in range(0, q.shape[0], chunk):
        dist = -pairwise_lorentz_inner(q[start : start + chunk], g, curv)
        if exclude_self:
            rows = torch.arange(dist.shape[0])
            dist[rows, rows + start] = float("inf")
        # Stable sort: equal distances keep gallery order, so results are reproducible.
        if depth == g.shape[0] or depth > 2048:
            idx = torch.sort(dist, dim=1, stable=True).indices[:, :depth]
        else:
            idx = torch.topk(dist, depth, dim=1, largest=False, sorted=True).indices
        out[start : start + chunk] = idx.numpy()
    return out


def _average_precision(relevant: np.ndarray, n_relevant: np.ndarray) -> np.ndarray:
    """AP per row of a 0/1 relevance matrix, normalised by ``n_relevant`` (0 where none)."""
    hits = np.cumsum(relevant, axis=1)
    precision = hits / np.arange(1, relevant.shape[1] + 1)
    total = (precision * relevant).sum(axis=1)
    return np.divide(total, n_relevant, out=np.zeros_like(total), where=n_relevant > 0)


def retrieval_metrics(
    queries: np.ndarray,
    gallery: np.ndarray,
    labels: np.ndarray,
    curv: float,
    map_depth: int = DEFAULT_MAP_DEPTH,
    full_map: bool = False,
) -> RetrievalMetrics:
    """CMC@1 and mAP@``map_depth`` (and, with ``full_map``, mAP over the whole ranking), with
    the query set as its own gallery."""
    labels = np.asarray(labels)
    order = ranked_neighbours(queries, gallery, curv, k=None if full_map else map_depth)
    relevant = labels[order] == labels[:, None]
    top = relevant[:, :map_depth]
    ap_top = _average_precision(top, top.sum(axis=1))
    ap_full = _average_precision(relevant, relevant.sum(axis=1)) if full_map else None
    return RetrievalMetrics(
        cmc1=float(relevant[:, 0].mean()),
        map_at_k=float(ap_top.mean()),
        map_full=None if ap_full is None else float(ap_full.mean()),
    )


def p_com(m_new_old: float, m_old_old: float, m_ind_ind: float) -> float:
    """P_com = (M(new,old) − M(old,old)) / (M(ind,ind) − M(old,old)): share of the gap closed."""
    return (m_new_old - m_old_old) / (m_ind_ind - m_old_old)


def p_up(m_new_new: float, m_ind_ind: float) -> float:
    """P_up = (M(new,new) − M(ind,ind)) / M(ind,ind): what compatibility costs the new model."""
    return (m_new_new - m_ind_ind) / m_ind_ind


def neighbour_recall(
    new_queries: np.ndarray, old_gallery: np.ndarray, curv: float, k: int = 10
) -> float:
    """Fraction of the old model's own top-k neighbours (old→old) that new→old search returns."""
    old_nn = ranked_neighbours(old_gallery, old_gallery, curv, k=k)
    new_nn = ranked_neighbours(new_queries, old_gallery, curv, k=k)
    shared = [
        len(np.intersect1d(a, b, assume_unique=True)) for a, b in zip(old_nn, new_nn, strict=True)
    ]
    return float(np.mean(shared) / k)


def top1_failures(embeddings: np.ndarray, labels: np.ndarray, curv: float) -> np.ndarray:
    """1 where the item's nearest other item (same model) has another label, else 0."""
    nearest = ranked_neighbours(embeddings, embeddings, curv, k=1)[:, 0]
    return (np.asarray(labels)[nearest] != np.asarray(labels)).astype(np.float64)


def uncertainty_calibration(
    uncertainty_values: np.ndarray, failures: np.ndarray, seed: int = 0
) -> dict[str, float | bool | None]:
    """Spearman ρ between an item's uncertainty and whether old→old retrieval fails for it, and
    the same for a shuffled copy of the uncertainties (the control: ≈ 0 when nothing leaks).

    A constant uncertainty has no ranks: ρ is reported as None and ``constant`` as True.
    """
    u = np.asarray(uncertainty_values, dtype=np.float64)
    f = np.asarray(failures, dtype=np.float64)
    constant = bool(np.ptp(u) == 0 or np.ptp(f) == 0)
    if constant:
        return {"spearman": None, "spearman_shuffled": None, "constant": True}
    shuffled = np.random.default_rng(seed).permutation(u)
    return {
        "spearman": float(spearmanr(u, f).statistic),
        "spearman_shuffled": float(spearmanr(shuffled, f).statistic),
        "constant": False,
    }
