"""What a vector engine indexes for a Lorentz gallery, and the exact float64 re-rank after it.

Pure and I/O-free (numpy and ``app.ml.geometry.lorentz``): the Milvus engine and the engine benchmark both
use it. Three layouts, chosen per gallery from measured facts (issue 14, ``bench.perf.engines``):

* ``cosine`` — every point at one radius r (cosine-lifted external galleries). Then
  ⟨q,x⟩_L = q·x − q₀x₀ with x₀ and ‖x‖ the same for every x, so the Lorentz ranking is the
  cosine ranking of the space components: an ordinary COSINE index over x ranks exactly.
* ``tangent`` — points at many radii. An engine's HNSW or IVF builds its graph or clusters from
  gallery-to-gallery scores; over lifted vectors those inner products are not hyperbolic and
  recall@10 fell to 0.02–0.19. The tangent vector v = log₀(x) keeps the direction of x and has
  norm d(o,x), so L2 neighbours in the tangent space are a good candidate list: an L2 HNSW over
  v proposes k′ candidates and the float64 Lorentz distance re-ranks them. Kept for collections
  made before ``poincare``: it weights angles by r where the hyperbolic metric does by sinh r, so
  at radius 6 the exact top-10 needed k′ ≈ 200–300 L2 candidates.
* ``poincare`` — points at many radii, the layout new ones get. The Poincaré-ball coordinate
  p = x / (1 + √c x₀) is conformal (the ball's metric is (2/δ)² times the Euclidean one, with
  δ = 1 − c‖p‖²), so Euclidean neighbourhoods have hyperbolic shapes and only their scale
  varies with radius; exactly, cosh(√c d(p,q)) = 1 + 2c‖p − q‖² / (δ_p δ_q). An L2 HNSW over p
  proposes k′ candidates (the exact top-10 fell within the first 50 L2 neighbours for 98 % of
  queries at radius 6, against 63 % for the tangent vectors), and each row also stores δ,
  computed in float64, so that x = 2p/δ comes back to float32 precision near the boundary,
  where 1 − c‖p‖² from float32 p would cancel.
* ``lifted`` — exact search for galleries at many radii: a FLAT inner-product scan over
  x̃ = (x₀, x) with the query (−q₀, q) scores ⟨q,x⟩_L (exact in real arithmetic; float32
  cancels far from the origin, which the over-fetch and the float64 re-rank repair, as in
  ``app.vectors.faiss_index``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from app.ml.geometry.lorentz import exp_map0, log_map0
from app.vectors.lorentz_rows import (
    LIFT_BLOCK,
    exact_distances,
    lifted_gallery,
    lifted_queries,
    nearest_first,
)

Layout = Literal["cosine", "tangent", "poincare", "lifted"]
LAYOUTS: tuple[str, ...] = ("cosine", "tangent", "poincare", "lifted")
# Engine metric of each layout's search vectors (Milvus names).
LAYOUT_METRIC: dict[str, str] = {
    "cosine": "COSINE",
    "tangent": "L2",
    "poincare": "L2",
    "lifted": "IP",
}
# Relative spread of radii still called "one radius": the lift of unit vectors computes every
# radius from the same scale, so only float32 rounding of the stored components separates them.
ONE_RADIUS_TOLERANCE = 1e-4


def choose_layout(one_radius: bool, exact: bool) -> tuple[Layout, str]:
    """(layout, index type): COSINE HNSW (FLAT when exact) for one-radius galleries; otherwise
    an L2 HNSW over Poincaré-ball coordinates, or an exact FLAT scan over lifted vectors."""
    if one_radius:
        return "cosine", "FLAT" if exact else "HNSW"
    return ("lifted", "FLAT") if exact else ("poincare", "HNSW")


def search_dim(layout: str, point_dim: int) -> int:
    return point_dim + 1 if layout == "lifted" else point_dim


def radii(points: np.ndarray, curv: float) -> np.ndarray:
    """d(o,x) = asinh(√c‖x‖)/√c per row, in float64."""
    norms = np.linalg.norm(np.asarray(points, dtype=np.float64), axis=-1)
    return np.arcsinh(np.sqrt(curv) * norms) / np.sqrt(curv)


def at_one_radius(points: np.ndarray, curv: float) -> bool:
    """Whether every row lies at the same radius (up to float32 rounding of its components)."""
    if len(points) == 0:
        return True
    r = radii(points, curv)
    return bool(r.max() - r.min() <= ONE_RADIUS_TOLERANCE * max(r.max(), 1.0))


def _tangent(points: np.ndarray, curv: float) -> np.ndarray:
    with torch.no_grad():
        return log_map0(torch.from_numpy(np.asarray(points, dtype=np.float64)), curv).numpy()


def poincare(points: np.ndarray, curv: float) -> np.ndarray:
    """Poincaré-ball coordinates p = x / (1 + √(1 + c‖x‖²)) of space components x, in float64
    (√c x₀ = √(1 + c‖x‖²) on the hyperboloid ⟨x,x⟩_L = −1/c; ‖p‖ = tanh(√c d(o,x)/2)/√c)."""
    x = np.asarray(points, dtype=np.float64)
    return x / (1.0 + np.sqrt(1.0 + curv * (x**2).sum(-1, keepdims=True)))


def boundary_gap(points: np.ndarray, curv: float) -> np.ndarray:
    """δ = 1 − c‖p‖² = 2 / (1 + √(1 + c‖x‖²)) per row, in float64 from the space components (not
    from p, whose float32 rounding would cancel in 1 − c‖p‖² near the boundary)."""
    x = np.asarray(points, dtype=np.float64)
    return 2.0 / (1.0 + np.sqrt(1.0 + curv * (x**2).sum(-1)))


def points_from_poincare(p: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """Space components x = 2p/δ (float64) from ball coordinates and their stored gaps δ."""
    return 2.0 * np.asarray(p, dtype=np.float64) / np.asarray(gap, dtype=np.float64)[..., None]


def gallery_search_vectors(layout: str, points: np.ndarray, curv: float) -> np.ndarray:
    """float32 rows the engine indexes for space components ``points`` (N × d)."""
    points = np.asarray(points)
    if layout == "cosine":
        return np.ascontiguousarray(points, dtype=np.float32)
    if layout == "tangent":
        return _tangent(points, curv).astype(np.float32)
    if layout == "poincare":
        return poincare(points, curv).astype(np.float32)
    if layout == "lifted":
        return lifted_gallery(points, curv)
    raise ValueError(f"unknown layout {layout!r}, expected one of {LAYOUTS}")


def query_search_vectors(layout: str, queries: np.ndarray, curv: float) -> np.ndarray:
    """float32 query rows for the engine: q itself (cosine), log₀(q) (tangent), its ball
    coordinates (poincare), (−q₀, q) (lifted, so that the inner product is the Lorentz one)."""
    if layout == "lifted":
        return lifted_queries(queries, curv)
    return gallery_search_vectors(layout, queries, curv)


def points_from_search_vectors(
    layout: str, vectors: np.ndarray, curv: float, gap: np.ndarray | None = None
) -> np.ndarray:
    """Space components (float64) back from indexed rows, for the exact re-rank (``gap``: the
    rows' stored δ, which the poincare layout needs)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    if layout == "poincare":
        if gap is None:
            raise ValueError("the poincare layout needs each row's stored gap δ")
        return points_from_poincare(vectors, gap)
    if layout == "cosine":
        return vectors
    if layout == "lifted":
        return vectors[..., 1:]
    if layout == "tangent":
        with torch.no_grad():
            return exp_map0(torch.from_numpy(vectors), curv).numpy()
    raise ValueError(f"unknown layout {layout!r}, expected one of {LAYOUTS}")


def cosine_lift(vectors: np.ndarray, scale: float, curv: float) -> np.ndarray:
    """exp₀(scale·v/‖v‖) in float64: space part sinh(√c·scale)/√c · v/‖v‖ (the cosine lift of
    ``app.ml.geometry.space.EuclideanLift``, written out so that it runs on numpy rows)."""
    v = np.asarray(vectors, dtype=np.float64)
    # A zero vector has no direction; the floor keeps it at the origin instead of NaN.
    unit = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
    return np.sinh(np.sqrt(curv) * scale) / np.sqrt(curv) * unit


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
