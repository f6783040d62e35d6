"""Lorentz rows in float32 and exact distances in float64: the lift of gallery points and
queries that turns nearest points into largest inner products, and the cancellation-free distance
the re-rank uses. Pure numpy; shared by the FAISS index and Milvus's maths."""

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
