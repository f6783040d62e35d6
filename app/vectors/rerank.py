"""The exact float64 re-rank every engine ends with, and its tie rule.

Whatever proposes the candidates (FAISS's float32 scan, a Milvus index, an attached collection's
cosine top k), their order is decided here, by the exact Lorentz distance in float64
(``lorentz_rows.exact_distances``), equal distances in increasing internal id
(``lorentz_rows.nearest_first``), so that every engine, and one gallery after a rebuild, answers
in one order. Also the brute-force truth and the recall measures the engine tests and benchmarks
compare against. Pure and I/O-free (numpy).
"""

from __future__ import annotations

import numpy as np

from app.vectors.lorentz_rows import LIFT_BLOCK, cosine_lift, exact_distances, nearest_first

# Float64 values the exact re-rank gathers at once (queries × candidates × dim): 32 MiB. The
# distance computation holds a few arrays of that size beside it, so a search's re-rank peaks at
# a few times this: at 2**25 (256 MiB) one search of 200 queries × k = 1,000 traced a 0.96 GiB
# peak, and a streamed answer repeated it chunk after chunk (issue 45 item 6, the soak bench).
RERANK_BUDGET = 2**22


def no_hits(nq: int, k: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids −1, distances inf, points NaN), nq × k: a search's answer before any hit."""
    return (
        np.full((nq, k), -1, dtype=np.int64),
        np.full((nq, k), np.inf),
        np.full((nq, k, dim), np.nan, dtype=np.float32),
    )


def ranked_hits(
    query: np.ndarray,
    vectors: np.ndarray,
    scale: float,
    curv: float,
    k: int,
    ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An attached cosine collection's hits for one query (space components), ordered by exact
    Lorentz distance: (positions into ``vectors``, float64 distances, float32 lifted points),
    nearest first, at most k; equal distances in increasing ``ids`` order (the hits' internal
    ids) when given. The hits' stored vectors are lifted as the service lifts them."""
    found = cosine_lift(vectors, scale, curv).astype(np.float32)
    valid = np.ones((1, len(found)), dtype=bool)
    keys = None if ids is None else np.asarray(ids)[None]
    order, dist = rerank(np.asarray(query)[None], found[None], valid, k, curv, ids=keys)
    at = order[0][order[0] >= 0]
    return at, dist[0, : len(at)], found[at]


def rerank(
    queries: np.ndarray,
    candidates: np.ndarray,
    valid: np.ndarray,
    k: int,
    curv: float,
    ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Order the candidates of each query by exact float64 Lorentz distance.

    ``queries`` nq × d, ``candidates`` nq × m × d (space components), ``valid`` nq × m (False
    where the engine returned fewer than m). Returns positions into the m candidates (nq × k,
    −1 where fewer than k are valid) and distances (inf there), nearest first; equal distances
    in increasing ``ids`` order (nq × m) when given, else in the engine's order.
    """
    queries = np.asarray(queries, dtype=np.float64)
    nq, m = valid.shape
    positions = np.full((nq, k), -1, dtype=np.int64)
    distances = np.full((nq, k), np.inf, dtype=np.float64)
    if m == 0 or nq == 0:
        return positions, distances
    dist = exact_distances(queries[:, None, :], candidates, curv)
    dist = np.where(valid, dist, np.inf)
    if ids is None:
        order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    else:
        order = nearest_first(dist, ids, k)
    top = np.take_along_axis(dist, order, axis=1)
    found = min(k, m)
    positions[:, :found] = np.where(np.isfinite(top), order, -1)
    distances[:, :found] = top
    return positions, distances


def exact_top_k(
    queries: np.ndarray, points: np.ndarray, k: int, curv: float, *, margin: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force truth: positions (nq × k) and float64 distances of the k nearest points.

    Scores every point by the Lorentz inner product in float64 (matrix products over blocks of
    the gallery; float64 keeps its cancellation far below the gaps between neighbours at radius
    ≤ 6), keeps the k + ``margin`` best and orders those by the exact distance formula."""
    queries = np.asarray(queries, dtype=np.float64)
    nq, n = len(queries), len(points)
    m = min(n, k + margin)
    lifted_q = np.concatenate([-np.sqrt(1.0 / curv + (queries**2).sum(1))[:, None], queries], 1)
    best_scores = np.empty((nq, 0))
    best_positions = np.empty((nq, 0), dtype=np.int64)
    for start in range(0, n, LIFT_BLOCK):
        block = np.asarray(points[start : start + LIFT_BLOCK], dtype=np.float64)
        lifted_block = np.concatenate([np.sqrt(1.0 / curv + (block**2).sum(1))[:, None], block], 1)
        scores = np.concatenate([best_scores, lifted_q @ lifted_block.T], axis=1)
        positions = np.concatenate(
            [
                best_positions,
                np.broadcast_to(np.arange(start, start + len(block)), (nq, len(block))),
            ],
            axis=1,
        )
        keep = np.argpartition(-scores, min(m, scores.shape[1]) - 1, axis=1)[:, :m]
        best_scores = np.take_along_axis(scores, keep, axis=1)
        best_positions = np.take_along_axis(positions, keep, axis=1)
    dist = exact_distances(queries[:, None, :], np.asarray(points)[best_positions], curv)
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(best_positions, order, 1), np.take_along_axis(dist, order, 1)


def recall_within(found_distances: np.ndarray, true_distances: np.ndarray) -> float:
    """Recall@k that counts ties: a found item is right when its exact distance is no larger
    than the true k-th distance (two items at one distance are equally right answers).

    ``found_distances``: the exact distances of the items a search returned (nq × k, inf where
    it returned fewer), computed by the caller from the stored points, not taken from the
    search; ``true_distances``: the brute-force top-k distances (nq × k)."""
    kth = true_distances[:, -1:]
    tolerance = 1e-9 * np.maximum(kth, 1.0)
    return float(np.mean(found_distances <= kth + tolerance))


def recall_at_k(found: list[list[str]] | np.ndarray, truth: list[list[str]] | np.ndarray) -> float:
    """Mean fraction of each query's true top-k found (the rows of ``truth`` define k)."""
    rates = [
        len(set(list(f)) & set(list(t))) / max(len(t), 1) for f, t in zip(found, truth, strict=True)
    ]
    return float(np.mean(rates)) if rates else 0.0
