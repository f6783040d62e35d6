"""Lorentz rows in float32 and exact distances in float64: the lift of gallery points and
queries that turns nearest points into largest inner products, and the cancellation-free distance
the re-rank uses, and the order of the ranked rows (nearest first, ties by id). Pure numpy; shared
by the FAISS index, Milvus's maths and the searches of attached collections."""

from __future__ import annotations

import numpy as np

# Rows lifted at a time (bounds the float64 working copy).
LIFT_BLOCK = 65536


def time_component64(x: np.ndarray, curv: float) -> np.ndarray:
    return np.sqrt(1.0 / curv + np.einsum("...i,...i->...", x, x))


def exact_distances(queries: np.ndarray, points: np.ndarray, curv: float) -> np.ndarray:
    """Lorentz distances in float64 for paired rows (… × d), without catastrophic cancellation.

    −c⟨q,x⟩_L = 1 + t with t = (c/2)(‖q − x‖² − (q₀ − x₀)²) ≥ 0 and q₀ − x₀ written as
    (‖q‖² − ‖x‖²)/(q₀ + x₀); then d = acosh(1 + t)/√c = log1p(t + √(t(t + 2)))/√c.
    """
    q = np.asarray(queries, dtype=np.float64)
    x = np.asarray(points, dtype=np.float64)
    q0 = time_component64(q, curv)
    x0 = time_component64(x, curv)
    diff = q - x
    dt = (np.einsum("...i,...i->...", q, q) - np.einsum("...i,...i->...", x, x)) / (q0 + x0)
    # The spacelike difference of two sheet points has a non-negative Lorentz norm; rounding
    # can leave a tiny negative t for (near-)identical points, where the distance is 0.
    t = np.maximum(0.5 * curv * (np.einsum("...i,...i->...", diff, diff) - dt * dt), 0.0)
    return np.log1p(t + np.sqrt(t * (t + 2.0))) / np.sqrt(curv)


def exact_distances_and_cosines(
    queries: np.ndarray, points: np.ndarray, curv: float, cosines: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """``exact_distances`` (the same operations in the same order, so the same float64 values)
    and, with ``cosines``, cos(q, x) of the space components, sharing the squared norms the
    distance needs. A zero vector (the origin) has no direction: its cosine is taken as 0."""
    q = np.asarray(queries, dtype=np.float64)
    x = np.asarray(points, dtype=np.float64)
    qq = np.einsum("...i,...i->...", q, q)
    xx = np.einsum("...i,...i->...", x, x)
    q0 = np.sqrt(1.0 / curv + qq)
    x0 = np.sqrt(1.0 / curv + xx)
    diff = q - x
    dd = np.einsum("...i,...i->...", diff, diff)
    dt = (qq - xx) / (q0 + x0)
    t = np.maximum(0.5 * curv * (dd - dt * dt), 0.0)
    distances = np.log1p(t + np.sqrt(t * (t + 2.0))) / np.sqrt(curv)
    if not cosines:
        return distances, None
    norms = np.sqrt(qq) * np.sqrt(xx)
    # q·x = (‖q‖² + ‖x‖² − ‖q − x‖²)/2: no further pass over the points, and off by a few
    # float64 ulps of ‖q‖² + ‖x‖² (a cosine off by ~1e-16), where the distance needed ‖q − x‖²
    # itself, without that cancellation.
    dots = 0.5 * (qq + xx - dd)
    with np.errstate(invalid="ignore", divide="ignore"):
        return distances, np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)


def lifted_gallery(points: np.ndarray, curv: float, out: np.ndarray | None = None) -> np.ndarray:
    """Rows x̃ = (x₀, x) in float32 (x₀ from float64), written into ``out`` when given.

    Worked in blocks of rows so that a million-row gallery never holds a float64 copy at once.
    """
    points = np.asarray(points)
    n = len(points)
    if out is None:
        out = np.empty((n, points.shape[1] + 1), dtype=np.float32)
    for start in range(0, n, LIFT_BLOCK):
        block = np.asarray(points[start : start + LIFT_BLOCK], dtype=np.float64)
        out[start : start + len(block), 0] = time_component64(block, curv)
        out[start : start + len(block), 1:] = block
    return out


def lifted_queries(queries: np.ndarray, curv: float) -> np.ndarray:
    q = np.asarray(queries, dtype=np.float64)
    return np.ascontiguousarray(
        np.concatenate([-time_component64(q, curv)[:, None], q], axis=1), dtype=np.float32
    )


def nearest_first(distances: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """Column order of the ``k`` smallest distances per row (nq × m → nq × min(k, m)), equal
    distances in increasing id order.

    Exact ties are common in real galleries (duplicate documents embed to the same vector), and
    an engine returns tied rows in whatever order it stored or scanned them: breaking ties by
    id makes every engine, and the same gallery after a rebuild, answer in one order. The
    callers fetch candidates past the k-th so that a tie across the k-th place is seen whole.
    """
    keys = np.broadcast_to(np.asarray(ids), np.shape(distances))
    return np.lexsort((keys, distances), axis=-1)[..., :k]


def best_by_id(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (ids, scores) per row of candidates (nq × m, larger scores better), equal
    scores in increasing id order (``nearest_first``)."""
    order = nearest_first(-np.asarray(scores), ids, k)
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(scores, order, axis=1)


def cosine_lift(vectors: np.ndarray, scale: float, curv: float) -> np.ndarray:
    """exp₀(scale·v/‖v‖) in float64: space part sinh(√c·scale)/√c · v/‖v‖ (the cosine lift of
    ``app.ml.geometry.space.EuclideanLift``, written out so that it runs on numpy rows)."""
    v = np.asarray(vectors, dtype=np.float64)
    # A zero vector has no direction; the floor keeps it at the origin instead of NaN.
    unit = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
    return np.sinh(np.sqrt(curv) * scale) / np.sqrt(curv) * unit
