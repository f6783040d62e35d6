"""A two-stage search's second stage for a whole batch at once: the candidates ranked by the new
model (issue 43's speed target): per query the candidates with a new vector by the new cosine,
or by the fused score, ties in the old index's order, then the others in the old index's order —
with no loop over the queries but the one that hands the hits out: the new vectors' lookup, the cosines (float32 products, as there)
and the orders are whole-array operations, the cosines worked in blocks of queries whose rows
stay in cache."""

from __future__ import annotations

import numpy as np

from app.ml.backfill.two_stage import unit
from app.search.two_stage import Fusion, NewVectors

# Float32 values of new vectors gathered at once (queries × candidates × dim): 1 MiB, one or a
# few queries' candidates (at depth 200 and 768 dimensions one query each: on the 2-core machine
# that beat blocks of 6 queries by 2×, their gathered rows falling out of cache). ``np.matmul`` of
# a block runs the BLAS product one query's ``rows @ query`` runs.
COSINE_BLOCK = 2**18

Hit = tuple[int, float, float, bool]


def new_cosines(
    queries: np.ndarray, rows: np.ndarray, at: np.ndarray, block: int = COSINE_BLOCK
) -> np.ndarray:
    """cos of each query (unit rows, nq × D float32) with its candidates' new vectors
    (``rows[at]``, unit rows; nq × m positions, −1 where a candidate has none: 0 there), as
    float64 values of float32 products."""
    nq, m = at.shape
    out = np.zeros((nq, m), dtype=np.float64)
    scored = at >= 0
    if not scored.any():  # nothing to gather (``rows`` may be empty)
        return out
    taken = np.where(scored, at, 0)
    chunk = max(1, block // (m * max(1, rows.shape[1])))
    for start in range(0, nq, chunk):
        part = slice(start, start + chunk)
        gathered = rows[taken[part]]  # b × m × D
        products = np.matmul(gathered, queries[part, :, None])[..., 0]
        out[part] = np.where(scored[part], products, 0.0)
    return out


def ranked(
    ids: np.ndarray,
    distances: np.ndarray,
    old_scores: np.ndarray,
    query_features: np.ndarray,
    vectors: NewVectors,
    k: int,
    fusion: Fusion | None = None,
) -> list[list[Hit]]:
    """Per query its k hits as (internal id, distance, score, scored by the new model): the
    candidates with a new vector by the new cosine — or, with ``fusion``, by the fused score
    w·z(old cosine) + (1 − w)·z(new cosine) (``app.ml.backfill.two_stage``) — ties in the old
    index's order, then the others in the old index's order; padded candidates (id −1)
    skipped."""
    nq, m = ids.shape
    if nq == 0:
        return []
    queries = unit(query_features)
    valid = ids >= 0
    at = np.where(valid, vectors.positions(ids.reshape(-1)).reshape(nq, m), -1)
    scored = at >= 0
    cos = new_cosines(queries, vectors.rows, at)
    key = cos
    if fusion is not None:
        sc = fusion.scale
        key = (
            fusion.weight * (old_scores - sc.old_mean) / sc.old_std
            + (1 - fusion.weight) * (cos - sc.new_mean) / sc.new_std
        )
    # The scored candidates first, by the key (best first; a stable sort keeps the index's
    # order among equal keys), then the valid unscored ones in the index's order.
    new_first = np.lexsort((-key, ~scored), axis=1)
    old_first = np.argsort(~(valid & ~scored), axis=1, kind="stable")
    n_new = np.minimum(scored.sum(axis=1), k)
    n_old = np.minimum((valid & ~scored).sum(axis=1), k - n_new)
    width = min(k, m)
    new_cols = new_first[:, :width]
    old_cols = old_first[:, :width]
    c = np.clip(np.take_along_axis(cos, new_cols, axis=1), -1.0, 1.0)
    new_ids = np.take_along_axis(ids, new_cols, axis=1).tolist()
    new_dist = np.arccos(c).tolist()
    new_score = (c if fusion is None else np.take_along_axis(key, new_cols, axis=1)).tolist()
    old_ids = np.take_along_axis(ids, old_cols, axis=1).tolist()
    old_dist = np.take_along_axis(distances, old_cols, axis=1).tolist()
    old_score = np.take_along_axis(old_scores, old_cols, axis=1).tolist()
    out: list[list[Hit]] = []
    for q, (a, b) in enumerate(zip(n_new.tolist(), n_old.tolist(), strict=True)):
        hits: list[Hit] = [(new_ids[q][i], new_dist[q][i], new_score[q][i], True) for i in range(a)]
        hits += [(old_ids[q][i], old_dist[q][i], old_score[q][i], False) for i in range(b)]
        out.append(hits)
    return out
