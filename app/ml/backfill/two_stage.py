"""Two-stage search: candidates from the old index, ranked by the new model (issue 43).

A bridge of text embeddings rarely beats staying with the old model; the new model itself does
(a reindex), but needs every document re-embedded. Two stages take the new model's quality from
the first query at the cost of embedding only what queries touch:

1. **Candidates** — the ``depth`` items of the old gallery nearest to the query's old-space
   vector: the old model's own query vector while the old model runs, else a bridged query.
   Ranked by cosine, which is the service's Lorentz order for a cosine gallery (every stored
   point has one radius, so the Lorentz distance falls as the cosine rises).
2. **Rerank** — each candidate scored by the cosine of the query's and the item's new-backbone
   features, optionally fused with its stage-one cosine:

       fused = w · (s_old − μ_old) / σ_old + (1 − w) · (s_new − μ_new) / σ_new

   each space standardised by ``FusionScale``: the mean and standard deviation of its
   query–document cosines over a fixed reference sample (never the candidates themselves, whose
   statistics change with the query). w = 0 is the new model alone among the candidates; w is
   chosen on held-out queries that are not the ones reported.

An item outside the candidates is never returned, so recall@k of the rerank is bounded by the
stage-one recall@depth (``ceiling``). Pure numpy; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Rows handled at once: Q × n float32 similarity blocks stay near 100 MB at n = 24,000.
CHUNK = 1024
# Guards a standard deviation of scores that are all equal (a constant space says nothing).
MIN_STD = 1e-6


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (float32); a zero row stays zero."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


@dataclass(frozen=True)
class FusionScale:
    """Per-space location and scale of query–document cosines (``fusion_scale``)."""

    old_mean: float
    old_std: float
    new_mean: float
    new_std: float

    def to_dict(self) -> dict[str, float]:
        return {
            "old_mean": self.old_mean,
            "old_std": self.old_std,
            "new_mean": self.new_mean,
            "new_std": self.new_std,
        }


def fusion_scale(
    query_old: np.ndarray, docs_old: np.ndarray, query_new: np.ndarray, docs_new: np.ndarray
) -> FusionScale:
    """Mean and standard deviation of every (query, document) cosine of a reference sample, in
    each space (rows of the two spaces are the same queries and the same documents)."""
    old = unit(query_old) @ unit(docs_old).T
    new = unit(query_new) @ unit(docs_new).T
    return FusionScale(
        float(old.mean()),
        max(float(old.std()), MIN_STD),
        float(new.mean()),
        max(float(new.std()), MIN_STD),
    )


def top_cosine(
    queries: np.ndarray, items: np.ndarray, k: int, chunk: int = CHUNK
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, cosines) of each query's ``k`` most similar items, best first; among equal cosines
    the lower id first (the service's tie rule)."""
    q, x = unit(queries), unit(items)
    k = min(k, x.shape[0])
    ids = np.empty((q.shape[0], k), dtype=np.int64)
    sims = np.empty((q.shape[0], k), dtype=np.float32)
    for start in range(0, q.shape[0], chunk):
        block = q[start : start + chunk] @ x.T
        part = np.argpartition(-block, k - 1, axis=1)[:, :k] if k < x.shape[0] else None
        if part is None:
            part = np.broadcast_to(np.arange(x.shape[0]), block.shape)
        values = np.take_along_axis(block, part, axis=1)
        order = np.lexsort((part, -values), axis=1)
        ids[start : start + chunk] = np.take_along_axis(part, order, axis=1)
        sims[start : start + chunk] = np.take_along_axis(values, order, axis=1)
    return ids, sims


@dataclass(frozen=True)
class Candidates:
    """Stage one's answer: per query the candidate ids (Q × depth, best first) and their
    old-space cosines."""

    ids: np.ndarray
    old: np.ndarray


def stage_one(query_old: np.ndarray, docs_old: np.ndarray, depth: int) -> Candidates:
    ids, sims = top_cosine(query_old, docs_old, depth)
    return Candidates(ids, sims)


def new_cosines(
    query_new: np.ndarray, docs_new: np.ndarray, ids: np.ndarray, budget: int = 1 << 25
) -> np.ndarray:
    """cos(query, document) in the new space for each query's candidate ``ids`` (Q × depth),
    a block of queries at a time within ``budget`` floats: gathered where the candidates are
    few, read off one product with every document where they are many (a rerank of the whole
    gallery)."""
    q, docs = unit(query_new), unit(docs_new)
    depth = ids.shape[1]
    gather = depth * docs.shape[1] <= docs.shape[0]
    per_query = depth * docs.shape[1] if gather else docs.shape[0]
    chunk = max(1, budget // max(per_query, 1))
    out = np.empty(ids.shape, dtype=np.float32)
    for start in range(0, ids.shape[0], chunk):
        rows, part = q[start : start + chunk], ids[start : start + chunk]
        if gather:
            out[start : start + chunk] = np.einsum("qd,qkd->qk", rows, docs[part])
        else:
            out[start : start + chunk] = np.take_along_axis(rows @ docs.T, part, axis=1)
    return out


def rerank(
    candidates: Candidates,
    query_new: np.ndarray,
    docs_new: np.ndarray,
    k: int,
    weight: float = 0.0,
    scale: FusionScale | None = None,
    depth: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of each query's ``k`` best candidates (of the first ``depth`` of
    ``candidates``; all by default) by the new model, fused with the old cosine at ``weight``
    (``scale`` required when weight > 0). ``docs_new`` rows are indexed by candidate id; a
    candidate whose new vector is all zeros (not embedded) scores its fused old part only.
    Ties: the candidate ranked earlier by stage one first."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError("weight must lie in [0, 1]")
    if weight > 0 and scale is None:
        raise ValueError("a fused rerank needs the fusion scale")
    ids = candidates.ids[:, :depth] if depth is not None else candidates.ids
    old = candidates.old[:, : ids.shape[1]]
    new = new_cosines(query_new, docs_new, ids)
    if weight > 0:
        assert scale is not None
        score = (
            weight * (old - scale.old_mean) / scale.old_std
            + (1.0 - weight) * (new - scale.new_mean) / scale.new_std
        )
    else:
        score = new
    # Stable sort on −score keeps stage one's order among ties.
    order = np.argsort(-score, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(score, order, axis=1)


def ceiling(candidates: Candidates, relevant: list[np.ndarray], depth: int) -> float:
    """Share of queries with a relevant item among the first ``depth`` candidates: the most any
    rerank of them can reach for single-relevant queries at recall@depth."""
    rows = [i for i, r in enumerate(relevant) if len(r)]
    if not rows:
        return float("nan")
    hit = [np.isin(candidates.ids[i, :depth], relevant[i]).any() for i in rows]
    return float(np.mean(hit))


def embedded_per_search(candidates: Candidates, depth: int) -> float:
    """Documents a lazy re-embed embeds per query when these queries are searched once each at
    ``depth`` with nothing embedded before: the distinct candidates over the queries (each is
    embedded once and stored) divided by the number of queries."""
    ids = candidates.ids[:, :depth]
    return float(np.unique(ids).size / max(ids.shape[0], 1))
