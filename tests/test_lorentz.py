"""Each Lorentz helper against a direct float64 formula, plus the identities the model must obey."""

from __future__ import annotations

import math

import pytest
import torch

from app.ml.geometry import lorentz as L

CURVS = [0.1, 1.0, 2.5]


def _points(n: int, d: int, scale: float, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g, dtype=torch.float64) * scale).to(dtype)


def _minkowski(x: torch.Tensor, c: float) -> torch.Tensor:
    """Full (x₀, x) coordinates in float64, built independently of the module."""
    x = x.double()
    x0 = torch.sqrt(1.0 / c + (x**2).sum(-1, keepdim=True))
    return torch.cat([x0, x], dim=-1)


def _direct_inner(x: torch.Tensor, y: torch.Tensor, c: float) -> torch.Tensor:
    X, Y = _minkowski(x, c), _minkowski(y, c)
    return -X[..., 0] * Y[..., 0] + (X[..., 1:] * Y[..., 1:]).sum(-1)


def _direct_distance(x: torch.Tensor, y: torch.Tensor, c: float) -> torch.Tensor:
    return torch.acosh(torch.clamp(-c * _direct_inner(x, y, c), min=1.0)) / math.sqrt(c)


@pytest.mark.parametrize("c", CURVS)
def test_points_lie_on_the_hyperboloid(c: float) -> None:
    x = _points(50, 8, 2.0, 0)
    X = _minkowski(x, c)
    assert torch.allclose(L.time_component(x, c), X[:, 0])
    # ⟨x,x⟩_L = −1/c on the sheet.
    assert torch.allclose(
        L.lorentz_inner(x, x, c), torch.full((50,), -1.0 / c, dtype=torch.float64), atol=1e-9
    )


@pytest.mark.parametrize("c", CURVS)
def test_inner_and_distances_match_direct_formulas(c: float) -> None:
    x, y = _points(40, 6, 1.5, 1), _points(30, 6, 1.5, 2)
    assert torch.allclose(L.lorentz_inner(x, y[:1], c), _direct_inner(x, y[:1], c))
    direct = _direct_distance(x[:, None, :], y[None, :, :], c)
    assert torch.allclose(L.pairwise_lorentz_distance(x, y, c), direct, atol=1e-9)
    assert torch.allclose(L.pairwise_lorentz_inner(x, y, c), _direct_inner(x[:, None], y[None], c))
    assert torch.allclose(L.lorentz_distance(x[:30], y, c), direct.diagonal()[:30], atol=1e-9)


@pytest.mark.parametrize("c", CURVS)
def test_float32_distances_are_close_to_float64(c: float) -> None:
    x, y = _points(40, 16, 0.5, 3), _points(40, 16, 0.5, 4)
    d32 = L.pairwise_lorentz_distance(x.float(), y.float(), c).double()
    d64 = _direct_distance(x[:, None], y[None], c)
    assert torch.allclose(d32, d64, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("c", CURVS)
def test_distance_is_symmetric_and_obeys_triangle_inequality(c: float) -> None:
    x = _points(60, 5, 1.0, 5)
    d = L.pairwise_lorentz_distance(x, x, c)
    assert torch.allclose(d, d.T, atol=1e-9)
    # d(i,k) ≤ d(i,j) + d(j,k) for every triple.
    slack = d[:, None, :] - (d[:, :, None] + d[None, :, :])
    assert slack.max().item() <= 1e-6


@pytest.mark.parametrize("c", CURVS)
def test_exp_map_matches_direct_formula_and_log_inverts_it(c: float) -> None:
    v = _points(100, 7, 1.2, 6)
    x = L.exp_map0(v, c)
    rn = math.sqrt(c) * v.norm(dim=-1, keepdim=True)
    # exp_o(v) = cosh(√c‖v‖)·o + sinh(√c‖v‖)·v/(√c‖v‖), with o = (1/√c, 0).
    assert torch.allclose(x, torch.sinh(rn) * v / rn)
    assert torch.allclose(L.time_component(x, c), (torch.cosh(rn) / math.sqrt(c)).squeeze(-1))
    assert torch.allclose(L.log_map0(x, c), v, atol=1e-9)
    # And the other way round: log then exp.
    assert torch.allclose(L.exp_map0(L.log_map0(x, c), c), x, atol=1e-9)
    # Direct acosh form of the log map.
    xn = x.norm(dim=-1, keepdim=True)
    log_direct = torch.acosh(torch.sqrt(1 + c * xn**2)) * x / (math.sqrt(c) * xn)
    assert torch.allclose(L.log_map0(x, c), log_direct, atol=1e-9)


def test_exp_map_is_finite_at_zero_and_saturates() -> None:
    v = torch.zeros(3, 4, dtype=torch.float32)
    assert torch.equal(L.exp_map0(v), v)
    big = torch.full((2, 4), 1e6, dtype=torch.float32)
    assert torch.isfinite(L.exp_map0(big)).all()
    assert torch.isfinite(L.lorentz_distance(L.exp_map0(big), L.exp_map0(-big))).all()


@pytest.mark.parametrize("c", CURVS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_map_saturates_at_the_documented_norm_along_v(c: float, dtype: torch.dtype) -> None:
    """√c‖v‖ is clamped to asinh(2¹⁵): ‖exp₀(v)‖ ≤ 2¹⁵/√c, reached exactly past the clamp, and
    the point keeps v's direction (algorithms §1)."""
    g = torch.Generator().manual_seed(11)
    directions = torch.randn(20, 5, generator=g, dtype=torch.float64)
    directions = directions / directions.norm(dim=-1, keepdim=True)
    bound = 2.0**15 / math.sqrt(c)
    for length in (100.0, 1e3, 1e6):
        x = L.exp_map0((directions * length).to(dtype), c).double()
        norms = x.norm(dim=-1)
        assert torch.all(norms <= bound * (1 + 1e-5)), (length, norms.max().item(), bound)
        assert torch.allclose(norms, torch.full_like(norms, bound), rtol=1e-5)
        assert torch.allclose(x / norms[:, None], directions, atol=1e-6)
    # Just below the clamp nothing changes: the direct formula still holds.
    t = 0.99 * L.MAX_EXP_ARG
    v = directions * (t / math.sqrt(c))
    assert torch.allclose(
        L.exp_map0(v, c).norm(dim=-1),
        torch.full((20,), math.sinh(t) / math.sqrt(c), dtype=torch.float64),
        rtol=1e-9,
    )
    # The gradient stays finite on the saturated side.
    v = (directions[:3] * 100.0).clone().requires_grad_(True)
    L.exp_map0(v, c).sum().backward()
    assert torch.isfinite(v.grad).all()


@pytest.mark.parametrize("c", CURVS)
def test_distance_to_origin_and_uncertainty(c: float) -> None:
    x = _points(50, 4, 2.0, 7)
    origin = torch.zeros(1, 4, dtype=torch.float64)
    direct = _direct_distance(origin, x, c)
    assert torch.allclose(L.distance_to_origin(x, c), direct, atol=1e-9)
    log_norm = L.log_map0(x, c).norm(dim=-1)
    assert torch.allclose(L.uncertainty(x, c), 1 - torch.tanh(math.sqrt(c) * log_norm))
    u = L.uncertainty(x, c)
    assert ((u > 0) & (u <= 1)).all()
    # Further from the origin ⇒ less uncertain.
    order = torch.argsort(direct)
    assert (u[order].diff() <= 1e-12).all()


@pytest.mark.parametrize("c", CURVS)
def test_half_aperture_matches_direct_formula(c: float) -> None:
    x = _points(50, 4, 3.0, 8)
    direct = torch.asin(torch.clamp(0.2 / (math.sqrt(c) * x.norm(dim=-1)), max=1 - 1e-12))
    assert torch.allclose(L.half_aperture(x, c, min_radius=0.1), direct, atol=1e-6)
    near_origin = torch.full((1, 4), 1e-4, dtype=torch.float64)
    assert L.half_aperture(near_origin, c).item() == pytest.approx(math.pi / 2, abs=1e-5)


@pytest.mark.parametrize("c", CURVS)
def test_exterior_angle_matches_hyperbolic_law_of_cosines(c: float) -> None:
    x, y = _points(60, 3, 1.0, 9), _points(60, 3, 1.0, 10)
    zero = torch.zeros_like(x)
    a = math.sqrt(c) * _direct_distance(zero, x, c)  # side o–x
    b = math.sqrt(c) * _direct_distance(x, y, c)  # side x–y
    e = math.sqrt(c) * _direct_distance(zero, y, c)  # side o–y, opposite the angle at x
    interior = torch.acos(
        (torch.cosh(a) * torch.cosh(b) - torch.cosh(e)) / (torch.sinh(a) * torch.sinh(b))
    )
    assert torch.allclose(L.exterior_angle(x, y, c), math.pi - interior, atol=1e-6)


def test_point_further_along_the_ray_is_inside_the_cone() -> None:
    x = _points(20, 5, 1.0, 11)
    along = 2.5 * x  # same direction, further from the origin: inside x's cone
    assert (L.entailment_violation(x, along) < 1e-6).all()
    back = -x  # the opposite direction lies outside every cone narrower than π/2
    assert (L.entailment_violation(x * 10, back) > 0.5).all()


@pytest.mark.parametrize("c", CURVS)
def test_inner_product_ranking_equals_distance_ranking(c: float) -> None:
    gallery, queries = _points(500, 12, 1.0, 12), _points(20, 12, 1.0, 13)
    scores = L.lift_query(queries, c) @ L.lift_for_index(gallery, c).T
    dist = L.pairwise_lorentz_distance(queries, gallery, c)
    assert torch.equal(torch.argsort(-scores, dim=1)[:, :10], torch.argsort(dist, dim=1)[:, :10])
    assert torch.allclose(L.distance_from_score(scores, c), dist, atol=1e-9)


def test_float32_paths_have_no_nans_and_finite_gradients() -> None:
    x = _points(64, 8, 1.0, 14, torch.float32).requires_grad_()
    y = _points(64, 8, 1.0, 15, torch.float32)
    loss = (
        L.pairwise_lorentz_distance(x, y).mean()
        + L.lorentz_distance(x, x).mean()
        + L.exterior_angle(x, x).mean()
        + L.half_aperture(x).mean()
        + L.log_map0(L.exp_map0(x)).sum()
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
