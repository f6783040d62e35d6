"""Lorentz (hyperboloid) model of hyperbolic space, curvature ``-curv`` with ``curv > 0``.

Points are stored by their **space components** ``x ∈ R^d``; the time component is implicit,
``x₀ = sqrt(1/curv + ‖x‖²)``, so every stored vector lies on the upper sheet by construction.

Every function is pure, works on any leading batch shape, and keeps the input dtype. Callers that
train under mixed precision should cast to float32 first: ``acosh``/``asin`` near their domain
edges lose all precision in half floats. Clamps carry a comment saying what they guard.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Smallest margin used to keep ``acosh``/``asin``/``acos``/``sqrt`` inside their domains.
EPS = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6, torch.float64: 1e-12}
# exp0 saturates here: sinh(asinh(2**15)) = 2**15 keeps ‖x‖ finite in float32 (MERU's bound).
MAX_EXP_ARG = math.asinh(2.0**15)
# Minimum radius of the entailment cone (κ in the docs): closer points get a half-aperture of π/2.
DEFAULT_CONE_MIN_RADIUS = 0.1


def _eps(x: Tensor) -> float:
    return EPS.get(x.dtype, 1e-6)


def time_component(x: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """x₀ = sqrt(1/c + ‖x‖²), the implicit time coordinate of a point on the hyperboloid."""
    return torch.sqrt(1.0 / curv + torch.sum(x * x, dim=-1))


def lorentz_inner(x: Tensor, y: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Paired Lorentz inner product ⟨x,y⟩_L = x·y − x₀y₀ (shapes broadcast; ≤ −1/c on the sheet)."""
    return torch.sum(x * y, dim=-1) - time_component(x, curv) * time_component(y, curv)


def pairwise_lorentz_inner(x: Tensor, y: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Pairwise ⟨xᵢ,yⱼ⟩_L for x (N×d), y (M×d) → N×M."""
    return (
        x @ y.transpose(-1, -2)
        - time_component(x, curv)[..., :, None] * time_component(y, curv)[..., None, :]
    )


def _distance_from_inner(inner: Tensor, curv: float | Tensor) -> Tensor:
    # −c⟨x,y⟩_L ≥ 1 in exact arithmetic; rounding can push it below 1 where acosh is undefined.
    arg = torch.clamp(-curv * inner, min=1.0 + _eps(inner))
    return torch.acosh(arg) / curv**0.5


def lorentz_distance(x: Tensor, y: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Paired geodesic distance d(x,y) = acosh(−c⟨x,y⟩_L) / sqrt(c)."""
    return _distance_from_inner(lorentz_inner(x, y, curv), curv)


def pairwise_lorentz_distance(x: Tensor, y: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Pairwise geodesic distances for x (N×d), y (M×d) → N×M."""
    return _distance_from_inner(pairwise_lorentz_inner(x, y, curv), curv)


def exp_map0(v: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Exponential map at the origin: tangent vector v ↦ sinh(t)·v / (√c‖v‖) (space part), with
    t = √c‖v‖ clamped to [ε, asinh(2¹⁵)]: ‖exp₀(v)‖ = sinh(t)/√c ≤ 2¹⁵/√c, direction v/‖v‖."""
    rc_norm = curv**0.5 * torch.norm(v, dim=-1, keepdim=True)
    # Above asinh(2^15) sinh overflows float32 after a few squarings downstream: the radius
    # saturates there while the direction v/‖v‖ is kept (the divisor is the unclamped norm).
    radius = torch.sinh(torch.clamp(rc_norm, min=_eps(v), max=MAX_EXP_ARG))
    # Below eps the ratio sinh(t)/t is 1 to working precision; the floor avoids 0/0 at v = 0.
    return radius * v / torch.clamp(rc_norm, min=_eps(v))


def log_map0(x: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Logarithmic map at the origin, inverse of ``exp_map0``: x ↦ asinh(√c‖x‖)·x / (√c‖x‖).

    (acosh(sqrt(1 + c‖x‖²)) = asinh(√c‖x‖); the asinh form is accurate near the origin.)
    """
    rc_norm = curv**0.5 * torch.norm(x, dim=-1, keepdim=True)
    # asinh(t)/t → 1 as t → 0; the clamp avoids 0/0 at the origin.
    rc_norm = torch.clamp(rc_norm, min=_eps(x))
    return torch.asinh(rc_norm) * x / rc_norm


def distance_to_origin(x: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """d(o,x) = asinh(√c‖x‖) / √c, the hyperbolic radius of x."""
    return torch.asinh(curv**0.5 * torch.norm(x, dim=-1)) / curv**0.5


def half_aperture(
    x: Tensor, curv: float | Tensor = 1.0, min_radius: float = DEFAULT_CONE_MIN_RADIUS
) -> Tensor:
    """Half-aperture of the entailment cone at x: asin(2κ / (√c‖x‖)), κ = ``min_radius``."""
    eps = _eps(x)
    # Adding eps to the denominator keeps the origin finite; the clamp keeps asin's argument in
    # (−1, 1): points closer than 2κ to the axis get the widest cone (≈ π/2), not NaN.
    asin_input = 2.0 * min_radius / (torch.norm(x, dim=-1) * curv**0.5 + eps)
    return torch.asin(torch.clamp(asin_input, min=-1.0 + eps, max=1.0 - eps))


def exterior_angle(x: Tensor, y: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Exterior angle at x of the geodesic triangle (o, x, y): how far y strays from x's cone axis.

    With γ = c⟨x,y⟩_L: ext(x,y) = acos((y₀ + γx₀) / (‖x‖ · sqrt(γ² − 1))).
    """
    eps = _eps(x)
    x_time = time_component(x, curv)
    y_time = time_component(y, curv)
    gamma = curv * lorentz_inner(x, y, curv)
    numer = y_time + gamma * x_time
    # γ² − 1 ≥ 0 on the sheet but reaches 0 when y = x: keep the sqrt's gradient finite.
    denom = torch.norm(x, dim=-1) * torch.sqrt(torch.clamp(gamma * gamma - 1.0, min=eps)) + eps
    # Rounding can carry the cosine just outside [−1, 1], where acos is NaN.
    return torch.acos(torch.clamp(numer / denom, min=-1.0 + eps, max=1.0 - eps))


def entailment_violation(
    apex: Tensor,
    point: Tensor,
    curv: float | Tensor = 1.0,
    min_radius: float = DEFAULT_CONE_MIN_RADIUS,
) -> Tensor:
    """max(0, ext(apex, point) − aper(apex)): zero iff ``point`` lies in ``apex``'s cone."""
    return torch.relu(exterior_angle(apex, point, curv) - half_aperture(apex, curv, min_radius))


def uncertainty(x: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Norm-based uncertainty u(x) = 1 − tanh(√c‖log₀ x‖) ∈ (0, 1]; near the origin means vague.

    ‖log₀ x‖ = d(o,x), so this is 1 − tanh(asinh(√c‖x‖)).
    """
    return 1.0 - torch.tanh(torch.asinh(curv**0.5 * torch.norm(x, dim=-1)))


def lift_for_index(x: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Gallery vector for inner-product search: x̃ = (x₀, x) ∈ R^{d+1}."""
    return torch.cat([time_component(x, curv)[..., None], x], dim=-1)


def lift_query(q: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Query vector for inner-product search: q̃ = (−q₀, q), so q̃·x̃ = ⟨q,x⟩_L."""
    return torch.cat([-time_component(q, curv)[..., None], q], dim=-1)


def distance_from_score(score: Tensor, curv: float | Tensor = 1.0) -> Tensor:
    """Lorentz distance from an inner-product score q̃·x̃ = ⟨q,x⟩_L; decreasing in the score."""
    return _distance_from_inner(score, curv)
