"""The pure layout math of the Milvus engine (``app.vectors.milvus.layouts``) on real WordNet
rows."""

from __future__ import annotations

import numpy as np
import pytest

from app.vectors.lorentz_rows import exact_distances
from app.vectors.milvus.layouts import (
    boundary_gap,
    choose_layout,
    gallery_search_vectors,
    poincare,
    points_from_search_vectors,
    radii,
)
from bench.perf.engine_workload import spread_points

OLD = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def gloss(wordnet_small: dict) -> np.ndarray:
    return wordnet_small[f"gloss.{OLD}"][:300].astype(np.float64)


def test_galleries_at_many_radii_get_the_poincare_layout() -> None:
    assert choose_layout(one_radius=False, exact=False) == ("poincare", "HNSW")
    assert choose_layout(one_radius=False, exact=True) == ("lifted", "FLAT")
    assert choose_layout(one_radius=True, exact=False) == ("cosine", "HNSW")


@pytest.mark.parametrize("curv", [0.5, 1.0, 2.0])
def test_ball_distance_identity_gives_the_lorentz_distance(gloss: np.ndarray, curv: float) -> None:
    """cosh(√c d) = 1 + 2c‖p − q‖² / (δ_p δ_q): the ball's L2 distance and the stored gaps give
    the hyperbolic distance exactly (the docstring's formula, checked against the float64
    Lorentz distance of ``app.vectors.faiss.index``)."""
    points = spread_points(gloss, 4.0, gloss)
    x, y = points[:40], points[40:80]
    p, q = poincare(x, curv), poincare(y, curv)
    gap_p, gap_q = boundary_gap(x, curv), boundary_gap(y, curv)
    np.testing.assert_allclose(gap_p, 1 - curv * (p**2).sum(1), rtol=1e-10)
    cosh = 1 + 2 * curv * ((p - q) ** 2).sum(1) / (gap_p * gap_q)
    expected = exact_distances(x, y, curv)
    np.testing.assert_allclose(np.arccosh(cosh) / np.sqrt(curv), expected, rtol=1e-7, atol=1e-9)
    # ‖p‖ = tanh(√c r / 2) / √c
    np.testing.assert_allclose(
        np.linalg.norm(p, axis=1), np.tanh(np.sqrt(curv) * radii(x, curv) / 2) / np.sqrt(curv)
    )


@pytest.mark.parametrize("radius", [1.0, 6.0, 12.0])
def test_points_come_back_from_float32_ball_rows_with_the_stored_gap(
    gloss: np.ndarray, radius: float
) -> None:
    """The engine stores p in float32 and δ beside it: x = 2p/δ keeps float32 precision at any
    radius, where δ recomputed from the float32 p cancels near the boundary (radius 12: δ ≈ 2.5e-5
    against float32's 6e-8 steps of ‖p‖², measured 3e-4 relative error against < 1e-6)."""
    points = spread_points(gloss, radius, gloss)
    rows = gallery_search_vectors("poincare", points, 1.0)
    assert rows.dtype == np.float32
    gap = boundary_gap(points, 1.0).astype(np.float32)  # stored as a FLOAT scalar
    back = points_from_search_vectors("poincare", rows, 1.0, gap)
    error = np.abs(back - points).max() / np.abs(points).max()
    assert error < 1e-6, error
    recomputed = 1 - (rows.astype(np.float64) ** 2).sum(1)
    naive = 2 * rows / recomputed[:, None]
    naive_error = np.abs(naive - points).max() / np.abs(points).max()
    if radius == 12.0:
        assert naive_error > 100 * error, (naive_error, error)
    with pytest.raises(ValueError, match="gap"):
        points_from_search_vectors("poincare", rows, 1.0)
