"""HMCL: admissible continual updates of Lorentz linear heads (arXiv 2609.29329; algorithms §4).

Each modality m has a frozen encoder whose features e are lifted onto the hyperboloid,
z = (z₀, z_s) with z_s = exp₀(s·e/‖e‖) (``space.EuclideanLift``), and a bias-free Lorentz linear
head f(W; z) = [sqrt(K + ‖Wz‖²); Wz] with W = [w₀ W_s] ∈ R^{d×(D+1)}, K = 1/c. Old geometry
(radii, distances within and across modalities) is kept iff every modality's old embeddings move
by one shared spatial rotation; to first order, with X_m the old features' spatial part and Y_m
their head outputs: Δw₀ᵐ = 0 and X_m ΔW_sᵐᵀ = Y_m Ωᵀ for one skew Ω.

After every AdamW step the realized displacement δᵐ = W̃ᵐ − Wᵐ is replaced by the closest
admissible one (the moments stay as AdamW left them):
- ``hmcl-mr`` (Ω = 0): δ_sᵐ ← δ_sᵐ(I − P_m), δ₀ᵐ ← 0, P_m = V_m V_mᵀ the protected subspace;
- ``hmcl-ca``: δ_sᵐ ← δ_sᵐ(I − P_m) + Ω B_mᵀP_m, δ₀ᵐ ← 0, B_m = X_m⁺Y_m the least-squares map and
  Ω the skew solution of ΩH + HΩ = F − Fᵀ, H = Σ B_mᵀP_mB_m, F = Σ δ_sᵐ P_m B_m (the closest
  admissible update at every ρ: see ``closest_admissible_correction``);
then task anchoring W ← βW_task_start + (1 − β)(W + δ*). ``finetune`` (plain AdamW) and ``ewc``
(AdamW on the loss plus a diagonal-Fisher penalty) are the baselines, on the same schedule.

The continual state keeps, per modality, only the accumulated **uncentred** second moment of the
old lifted features, Σ z zᵀ ((D+1)×(D+1)), its row count, and EWC's diagonal Fisher; the protected
basis V_m and the least-squares map B_m are derived from it and the current head at each task
start (B_m = (Σ x xᵀ)⁺ Σ x zᵀ Wᵐᵀ is exact given the moments). No raw feature is kept, so the
state's size does not depend on the number of tasks.

Each model version records the orthogonal R with y_new ≈ R·y_parent on the old data, fitted by
orthogonal Procrustes from the same moments (the default for CA), or exp of the anchored sum of Ω.
The latter is only first order, and where H is nearly singular the Lyapunov solution is large in
directions the fitted old outputs barely span while the real outputs do not vanish there: measured
on WordNet it explains the old rows' motion worse than no rotation at all, so it stays an option
whose residual every report shows. A query embedded by version j reaches a gallery of an ancestor
i through ``map_query_to_ancestor``.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from app.ml.hmcl_metrics import drift_measures, paired_recall_at_k, symmetric_recall_at_k
from app.ml.lorentz import entailment_violation, pairwise_lorentz_distance, time_component
from app.ml.models import EmbeddingModel
from app.ml.space import EuclideanLift
from app.ml.training import NO_HOOKS, TrainingHooks

METHODS = ("hmcl-ca", "hmcl-mr", "finetune", "ewc")
ROTATION_FITS = ("identity", "procrustes", "generator")
# The recorded rotation when the caller does not choose: only CA rotates old embeddings on purpose.
DEFAULT_ROTATION = {
    "hmcl-ca": "procrustes",
    "hmcl-mr": "identity",
    "finetune": "identity",
    "ewc": "identity",
}
STATE_FORMAT = 1
STATE_TYPE = "nobackfill-continual-state"
# Eigenvalues below this fraction of the largest are treated as 0 (the data's span ends there):
# inverting them would turn float64 rounding into huge, meaningless rotations.
RANK_TOL = 1e-10


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class LorentzLinearHeads(EmbeddingModel):
    """One bias-free Lorentz linear head per modality on cosine-lifted frozen features.

    ``forward(e, m)`` = Wᵐ z with z = (z₀, z_s), z_s = exp₀(s·e/‖e‖), z₀ = sqrt(1/c + ‖z_s‖²):
    the space components of f(W; z) = [sqrt(K + ‖Wz‖²); Wz].
    """

    kind = "lorentz-linear-heads"

    def __init__(
        self, input_dims: dict[str, int], dim: int, curv: float = 0.1, lift_scale: float = 1.0
    ) -> None:
        super().__init__()
        if not input_dims:
            raise ValueError("at least one modality is required")
        for name, in_dim in input_dims.items():
            # ParameterDict keys become state_dict path components: a dot would split them.
            if not name or "." in name:
                raise ValueError(f"modality names must be non-empty and dot-free, got {name!r}")
            if int(in_dim) < 1:
                raise ValueError(f"modality {name!r}: input dimension must be ≥ 1")
        if dim < 1:
            raise ValueError("dim must be ≥ 1")
        self.input_dims = {name: int(d) for name, d in input_dims.items()}
        self.dim = int(dim)
        self.curv = float(curv)
        self.lift_scale = float(lift_scale)
        self.lift = EuclideanLift(curv=self.curv, scale=self.lift_scale, metric="cosine")
        self.heads = nn.ParameterDict(
            {name: nn.Parameter(torch.zeros(self.dim, d + 1)) for name, d in input_dims.items()}
        )

    def get_config(self) -> dict[str, Any]:
        return {
            "input_dims": dict(self.input_dims),
            "dim": self.dim,
            "curv": self.curv,
            "lift_scale": self.lift_scale,
        }

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(self.input_dims)

    def input_dim(self, modality: str | None = None) -> int:
        return self.input_dims[self.resolve_modality(modality)]

    @property
    def output_dim(self) -> int:
        return self.dim

    @torch.no_grad()
    def init_identity(self, seed: int = 0) -> None:
        """Start as the frozen lift: W_s = I (a seeded random semi-orthogonal map when d ≠ D), w₀ = 0."""
        gen = torch.Generator().manual_seed(seed)
        for name, weight in self.heads.items():
            in_dim = self.input_dims[name]
            weight.zero_()
            if in_dim == self.dim:
                weight[:, 1:] = torch.eye(self.dim)
            else:
                q, _ = torch.linalg.qr(
                    torch.randn(max(self.dim, in_dim), min(self.dim, in_dim), generator=gen)
                )
                weight[:, 1:] = q if self.dim >= in_dim else q.T

    def lifted(self, features: Tensor, modality: str | None = None) -> Tensor:
        """z = (z₀, z_s) ∈ R^{D+1}: the frozen features on the hyperboloid, time component first."""
        name = self.resolve_modality(modality)
        if features.shape[-1] != self.input_dims[name]:
            raise ValueError(
                f"modality {name!r}: expected {self.input_dims[name]} features, "
                f"got {features.shape[-1]}"
            )
        spatial = self.lift(features)
        return torch.cat([time_component(spatial, self.curv)[..., None], spatial], dim=-1)

    def forward(self, features: Tensor, modality: str | None = None) -> Tensor:
        name = self.resolve_modality(modality)
        weight = self.heads[name]
        return self.lifted(features.to(weight.dtype), name) @ weight.T


# --------------------------------------------------------------------------------------------
# Protected geometry and the admissible corrections (pure tensor functions, any float dtype)
# --------------------------------------------------------------------------------------------


def protected_subspace(
    second_moment: Tensor, energy: float, min_rank: int, rank_tol: float = RANK_TOL
) -> tuple[Tensor, Tensor, float]:
    """Top eigenvectors V (D×r) of an uncentred second moment S = XᵀX (or XᵀX/n).

    r is the smallest rank whose eigenvalues capture a fraction ``energy`` of tr S, raised to
    ``min_rank``, and never past the numerical rank (eigenvalues > ``rank_tol``·λ_max).
    Returns (V, its eigenvalues λ₁ ≥ … ≥ λ_r, captured fraction Σλ_{≤r}/tr S).
    """
    evals, evecs = torch.linalg.eigh(second_moment)
    evals, evecs = evals.flip(0), evecs.flip(1)
    # S is PSD; eigh can return tiny negatives from rounding.
    evals = torch.clamp(evals, min=0.0)
    total = float(evals.sum())
    if total <= 0.0:
        return evecs[:, :0], evals[:0], 0.0
    numerical_rank = int((evals > rank_tol * evals[0]).sum())
    captured = torch.cumsum(evals, 0) / total
    # 1e-12 slack: with energy = 1 the cumulative sum reaches 1 only up to rounding.
    rank = int((captured < energy - 1e-12).sum()) + 1
    rank = min(max(rank, min_rank), numerical_rank)
    return evecs[:, :rank], evals[:rank], float(captured[rank - 1])


@dataclass
class ProtectedGeometry:
    """What the corrections need for one task, derived once at its start.

    Per modality: the protected basis V_m (D×r_m) and C_m = V_mᵀX_m⁺Y_m (r_m×d), so that the
    protected part of the least-squares map is P_m B_m = V_m C_m; since V_m are eigenvectors of
    X_mᵀX_m this is also X_p⁺Y_m for X_p = X_m V_m V_mᵀ. Shared: eigenvectors U of
    H = Σ C_mᵀC_m = Σ B_mᵀP_mB_m with eigenvalues h, and C_m U. When H is nearly
    full rank U is its whole eigenbasis (h may hold zeros) and ``lyapunov_weights`` holds
    1/(h_i + h_j), 0 where both vanish; otherwise U spans only the range (h > 0).
    """

    bases: dict[str, Tensor]
    coefficients: dict[str, Tensor]
    h_vectors: Tensor
    h_values: Tensor
    coefficients_in_h_basis: dict[str, Tensor]
    captured_energy: dict[str, float]
    lyapunov_weights: Tensor | None = None

    def least_squares_map(self, name: str) -> Tensor:
        """P_m B_m = V_m C_m (D×d): the least-squares map of the protected features."""
        return self.bases[name] @ self.coefficients[name]

    def to(self, dtype: torch.dtype) -> ProtectedGeometry:
        """A copy in another float type (derived in float64, applied in the weights' type)."""
        return ProtectedGeometry(
            {k: v.to(dtype) for k, v in self.bases.items()},
            {k: v.to(dtype) for k, v in self.coefficients.items()},
            self.h_vectors.to(dtype),
            self.h_values.to(dtype),
            {k: v.to(dtype) for k, v in self.coefficients_in_h_basis.items()},
            dict(self.captured_energy),
            None if self.lyapunov_weights is None else self.lyapunov_weights.to(dtype),
        )


def least_squares_coefficients(
    second_moment_lifted: Tensor, basis: Tensor, eigenvalues: Tensor, head: Tensor
) -> Tensor:
    """C with B = V C = X_p⁺ Y, for X_p = X V Vᵀ and Y = Z Wᵀ the old head outputs (V spanning
    X's whole numerical row space gives X⁺Y).

    From moments only: B = V Λ⁻¹ Vᵀ (Σ x zᵀ) Wᵀ, Λ = Vᵀ(Σ x xᵀ)V (diagonal, V are eigenvectors).
    """
    cross = second_moment_lifted[1:, :]  # Σ x zᵀ, D×(D+1)
    return (basis.T @ cross @ head.T) / eigenvalues[:, None]


def protected_geometry(
    second_moments: Mapping[str, Tensor],
    heads: Mapping[str, Tensor],
    energy: float,
    min_rank: int,
    rank_tol: float = RANK_TOL,
) -> ProtectedGeometry:
    """Protected bases, least-squares maps and H's eigenbasis from lifted second moments Σ z zᵀ
    (computed in float64 whatever the inputs' type).

    Only the protected part P_m B_m = V_m C_m of the least-squares map B_m = X_m⁺Y_m enters the
    closest admissible update; C_m = Λ_m⁻¹V_mᵀ(Σ x zᵀ)W_mᵀ needs no other eigenvector of XᵀX.
    """
    bases, coefs, captured = {}, {}, {}
    dim = next(iter(heads.values())).shape[0]
    h_matrix = torch.zeros(dim, dim, dtype=torch.float64)
    for name, moment in second_moments.items():
        moment = moment.double()
        basis, evals, frac = protected_subspace(moment[1:, 1:], energy, min_rank, rank_tol)
        coef = least_squares_coefficients(moment, basis, evals, heads[name].double())
        bases[name], coefs[name], captured[name] = basis, coef, frac
        h_matrix += coef.T @ coef
    h_vals, h_vecs = torch.linalg.eigh(h_matrix)
    h_max = float(h_vals.max()) if h_vals.numel() else 0.0
    # H = 0 (nothing protected) keeps nothing: there is no rotation to solve for.
    keep = h_vals > rank_tol * h_max if h_max > 0 else torch.zeros_like(h_vals, dtype=torch.bool)
    weights = None
    if 2 * int(keep.sum()) > dim:
        # Nearly full rank: solving in the whole eigenbasis costs the same as the range alone,
        # and skips the Q⊥ terms; pairs of null directions get Ω̃_ij = 0 (minimum norm).
        h_vals = torch.where(keep, h_vals, torch.zeros_like(h_vals))
        denom = h_vals[:, None] + h_vals[None, :]
        weights = torch.where(denom > 0, 1.0 / torch.where(denom > 0, denom, 1.0), 0.0)
        keep = torch.ones_like(keep)
    u = h_vecs[:, keep]
    return ProtectedGeometry(
        bases,
        coefs,
        u,
        h_vals[keep],
        {k: c @ u for k, c in coefs.items()},
        captured,
        weights,
    )


def solve_skew_lyapunov(h_matrix: Tensor, rhs: Tensor, rank_tol: float = RANK_TOL) -> Tensor:
    """Dense reference solution of ΩH + HΩ = K for skew K, H = U diag(h) Uᵀ ⪰ 0.

    Ω = U Ω̃ Uᵀ with Ω̃_ij = (UᵀKU)_ij / (h_i + h_j), and 0 where h_i + h_j = 0 (numerically:
    both below ``rank_tol``·h_max), which is the minimum-norm solution. O(d³): the trainer uses
    the low-rank form of ``shared_rotation_generator``.
    """
    h, u = torch.linalg.eigh(h_matrix)
    h = torch.where(h > rank_tol * h.max(), h, torch.zeros_like(h))
    denom = h[:, None] + h[None, :]
    rotated = u.T @ rhs @ u
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    return u @ torch.where(denom > 0, rotated / safe, torch.zeros_like(rotated)) @ u.T


@dataclass
class SkewGenerator:
    """Ω = U A Uᵀ + U G − GᵀUᵀ: a skew matrix that vanishes on the null space of H (U: d×R
    orthonormal, A: R×R skew, G: R×d with G U = 0, ``None`` when R = d and Q⊥ = 0). Kept
    factored: forming Ω costs O(d²R) that the correction does not need."""

    basis: Tensor
    inner: Tensor
    outer: Tensor | None

    def dense(self) -> Tensor:
        u, g = self.basis, self.outer
        omega = u @ self.inner @ u.T
        return omega if g is None else omega + u @ g - g.T @ u.T

    def times_transpose(self, coefficients: Tensor, coefficients_in_basis: Tensor) -> Tensor:
        """Ω Cᵀ from C (r×d) and C U (r×R), in O(dRr)."""
        u, g = self.basis, self.outer
        if g is None:
            return u @ (self.inner @ coefficients_in_basis.T)
        return u @ (self.inner @ coefficients_in_basis.T + g @ coefficients.T) - g.T @ (
            coefficients_in_basis.T
        )

    def scaled_sum(self, other: SkewGenerator, scale: float) -> SkewGenerator:
        """scale · (self + other), both on the same basis (the anchored sum of a task's Ω)."""
        outer = None
        if self.outer is not None or other.outer is not None:
            zero = self.basis.new_zeros(self.basis.shape[1], self.basis.shape[0])
            mine = zero if self.outer is None else self.outer
            theirs = zero if other.outer is None else other.outer
            outer = scale * (mine + theirs)
        return SkewGenerator(self.basis, scale * (self.inner + other.inner), outer)

    @classmethod
    def zeros(cls, basis: Tensor) -> SkewGenerator:
        rank, dim = basis.shape[1], basis.shape[0]
        outer = None if rank == dim else basis.new_zeros(rank, dim)
        return cls(basis, basis.new_zeros(rank, rank), outer)


def shared_rotation_generator(
    deltas: Mapping[str, Tensor], geometry: ProtectedGeometry
) -> SkewGenerator:
    """The skew Ω of the closest admissible update: ΩH + HΩ = F − Fᵀ with H = Σ C_mᵀC_m and
    F = Σ (δ_sᵐV_m) C_m = Σ δ_sᵐ P_m B_m (derivation: ``closest_admissible_correction``).

    In H's eigenbasis U with K = F − Fᵀ: Ω̃ = UᵀΩU has Ω̃_ij = (UᵀKU)_ij / (h_i + h_j), 0 where
    h_i + h_j = 0 (``solve_skew_lyapunov``), with no eigen-solve per step:
    FU = Σ (δ_sV)(C_mU) and UᵀKU = UᵀFU − (UᵀFU)ᵀ.
    - U the whole eigenbasis (``lyapunov_weights`` set): Ω = U Ω̃ Uᵀ.
    - U the range only (d×R, h > 0; Q⊥ = I − UUᵀ): Ω = U A Uᵀ + U G − GᵀUᵀ with A = Ω̃ and
      G = diag(1/h) UᵀK Q⊥ = diag(1/h)(−(KU)ᵀ − (UᵀKU)Uᵀ) (UᵀK = −(KU)ᵀ for skew K), where
      KU = FU − Σ C_mᵀ((δ_sV)ᵀU): O(dDr + dR²) per step instead of O(d³).
    """
    u, h, weights = geometry.h_vectors, geometry.h_values, geometry.lyapunov_weights
    f_u = torch.zeros_like(u)
    ft_u = torch.zeros_like(u)
    for name, delta in deltas.items():
        dv = delta[:, 1:] @ geometry.bases[name]  # δ_s V, d×r
        f_u += dv @ geometry.coefficients_in_h_basis[name]
        if weights is None:  # FᵀU only feeds G
            ft_u += geometry.coefficients[name].T @ (dv.T @ u)
    ut_f_u = u.T @ f_u
    ut_k_u = ut_f_u - ut_f_u.T  # R×R, skew
    if weights is not None:
        return SkewGenerator(u, ut_k_u * weights, None)
    inner = ut_k_u / (h[:, None] + h[None, :])
    outer = (-(f_u - ft_u).T - ut_k_u @ u.T) / h[:, None]
    return SkewGenerator(u, inner, outer)


def minimal_rotation_correction(
    deltas: Mapping[str, Tensor], bases: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """MR (Ω = 0): δ_sᵐ ← δ_sᵐ (I − V_m V_mᵀ), δ₀ᵐ ← 0 — old protected outputs do not move."""
    out = {}
    for name, delta in deltas.items():
        spatial = delta[:, 1:]
        basis = bases[name]
        corrected = spatial - (spatial @ basis) @ basis.T
        out[name] = torch.cat([torch.zeros_like(delta[:, :1]), corrected], dim=1)
    return out


def _rotation_terms(
    omega: Tensor | SkewGenerator, geometry: ProtectedGeometry, names: Sequence[str]
) -> dict[str, Tensor]:
    """Ω C_mᵀ (d×r_b) for every modality, the cheaper way: through dense Ω (O(d²R + d²r_b))
    or through its factors (O(R²r_b + dRr_b) per modality)."""
    if isinstance(omega, SkewGenerator) and omega.outer is None:
        # Ω Cᵀ = U A (CU)ᵀ: one d×R×R product shared by all modalities.
        u_inner = omega.basis @ omega.inner
        return {m: u_inner @ geometry.coefficients_in_h_basis[m].T for m in names}
    if isinstance(omega, SkewGenerator):
        dim, rank = omega.basis.shape
        ranks = [geometry.coefficients[m].shape[0] for m in names]
        dense_cost = 2 * dim * dim * rank + sum(dim * dim * r for r in ranks)
        factored_cost = sum(rank * rank * r + 3 * rank * dim * r for r in ranks)
        if factored_cost < dense_cost:
            return {
                m: omega.times_transpose(
                    geometry.coefficients[m], geometry.coefficients_in_h_basis[m]
                )
                for m in names
            }
        omega = omega.dense()
    return {m: omega @ geometry.coefficients[m].T for m in names}


def closest_admissible_correction(
    deltas: Mapping[str, Tensor],
    geometry: ProtectedGeometry,
    omega: Tensor | SkewGenerator | None = None,
) -> tuple[dict[str, Tensor], SkewGenerator | Tensor]:
    """CA: the admissible step closest to δ, jointly over modalities; returns (δ*, Ω).

    Admissible steps. With X_m the old features (N×D), P_m = V_mV_mᵀ their protected subspace,
    X_p = X_mP_m and B_m = X_m⁺Y_m the least-squares map of the old outputs Y_m, a step Δᵐ is
    admissible iff Δ₀ᵐ = 0 and, for one skew Ω shared by all modalities,

        X_p Δ_sᵐᵀ = X_p B_m Ωᵀ   (the protected outputs move by the rotation I + Ω),

    where X_p B_m = Π_{X_p} Y_m is the part of the old outputs the protected features explain
    (V_m are eigenvectors of X_mᵀX_m, so P_mB_m = X_p⁺Y_m). X_p has full column rank on span V_m,
    so this says Δ_sᵐP_m = Ω B_mᵀP_m = Ω C_mᵀV_mᵀ (C_m = V_mᵀB_m), and Δ_sᵐ(I − P_m) is free.

    Closest. Σ_m ‖Δᵐ − δᵐ‖² splits into Σ‖(Δ_sᵐ − δ_sᵐ)(I − P_m)‖² + ‖δ₀ᵐ‖² (minimised by keeping
    δ_sᵐ(I − P_m)) and Σ‖ΩC_mᵀ − δ_sᵐV_m‖², whose gradient over skew Ω vanishes iff the skew
    part of (ΩH − F) does: with H = Σ C_mᵀC_m and F = Σ (δ_sᵐV_m)C_m,

        ΩH + HΩ = F − Fᵀ,   δ_sᵐ* = δ_sᵐ(I − P_m) + Ω C_mᵀV_mᵀ,   δ₀ᵐ* = 0.

    At ρ = 1 with full rank this is the paper's Eq. 44–46. Using all of B_m (Ω B_mᵀ, F = Σ δ_sB_m)
    instead of its protected part P_mB_m would add a rotation term to the free part as well: not
    the closest point, and not idempotent. Here an admissible δ gives F = ΩH, so the solution is
    δ itself (on the range of H, the only part of Ω that moves anything): CA∘CA = CA.

    ``omega`` (dense or factored) overrides the Lyapunov solution; Ω = 0 gives MR exactly.
    """
    if omega is None:
        omega = shared_rotation_generator(deltas, geometry)
    rotation_terms = _rotation_terms(omega, geometry, list(deltas))
    out = {}
    for name, delta in deltas.items():
        spatial, basis = delta[:, 1:], geometry.bases[name]
        # δ_s − (δ_sV)Vᵀ + (ΩCᵀ)Vᵀ with one d×r×D product: Ω B_mᵀP_m = Ω Cᵀ Vᵀ.
        corrected = spatial + (rotation_terms[name] - spatial @ basis) @ basis.T
        out[name] = torch.cat([torch.zeros_like(delta[:, :1]), corrected], dim=1)
    return out, omega


def anchor_to_task_start(weight: Tensor, task_start: Tensor, anchor: float) -> Tensor:
    """W ← βW_task_start + (1 − β)W: the pull-back that bounds the drift by (1 − β)u_max/β.

    With steps ‖δ*‖ ≤ u_max, D_t = W_t − W_start obeys ‖D_{t+1}‖ ≤ (1 − β)(‖D_t‖ + u_max).
    """
    return anchor * task_start + (1.0 - anchor) * weight


# --------------------------------------------------------------------------------------------
# Rotations between versions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputMoments:
    """Σ y_new y_oldᵀ, Σ‖y_old‖², Σ‖y_new‖² over every old row of every modality, from the
    lifted second moments alone: y = Wz ⇒ Σ y_new y_oldᵀ = Σ_m W_newᵐ (Σ z zᵀ) W_oldᵐᵀ."""

    cross: Tensor
    old_sq: float
    new_sq: float

    @classmethod
    def of(
        cls,
        old_heads: Mapping[str, Tensor],
        new_heads: Mapping[str, Tensor],
        second_moments: Mapping[str, Tensor],
    ) -> OutputMoments:
        dim = next(iter(new_heads.values())).shape[0]
        cross = torch.zeros(dim, dim, dtype=torch.float64)
        old_sq = new_sq = 0.0
        for name, moment in second_moments.items():
            w_old, w_new = old_heads[name].double(), new_heads[name].double()
            m_old = moment.double() @ w_old.T  # (D+1)×d, shared by two of the three sums
            cross += w_new @ m_old
            old_sq += float((w_old.T * m_old).sum())
            new_sq += float(((w_new @ moment.double()) * w_new).sum())
        return cls(cross, old_sq, new_sq)

    def procrustes(self) -> Tensor:
        """Orthogonal R = argmin Σ‖y_new − R y_old‖² = U Vᵀ for Σ y_new y_oldᵀ = U Σ Vᵀ."""
        u, _, vt = torch.linalg.svd(self.cross)
        return u @ vt

    def relative_residual(self, rotation: Tensor) -> float:
        """sqrt(Σ‖y_new − R y_old‖² / Σ‖y_old‖²) for orthogonal R: what R leaves unexplained.

        Σ‖y_new − R y_old‖² = Σ‖y_new‖² + Σ‖y_old‖² − 2 tr(Rᵀ Σ y_new y_oldᵀ).
        """
        if self.old_sq <= 0.0:
            return 0.0
        resid = (
            self.new_sq + self.old_sq - 2.0 * float(torch.trace(rotation.double().T @ self.cross))
        )
        # Rounding can make a perfect fit's residual slightly negative.
        return math.sqrt(max(resid, 0.0) / self.old_sq)


def fit_shared_rotation(
    old_heads: Mapping[str, Tensor],
    new_heads: Mapping[str, Tensor],
    second_moments: Mapping[str, Tensor],
) -> Tensor:
    """Orthogonal Procrustes over all modalities' old rows, from the moments: y_new ≈ R y_old."""
    return OutputMoments.of(old_heads, new_heads, second_moments).procrustes()


def rotation_residual(
    rotation: Tensor,
    old_heads: Mapping[str, Tensor],
    new_heads: Mapping[str, Tensor],
    second_moments: Mapping[str, Tensor],
) -> float:
    """sqrt(Σ‖y_new − R y_old‖² / Σ‖y_old‖²) over the old rows (see ``OutputMoments``)."""
    return OutputMoments.of(old_heads, new_heads, second_moments).relative_residual(rotation)


def accumulated_rotation(rotations_since_parent: Sequence[np.ndarray]) -> np.ndarray:
    """R_j ⋯ R_{i+1} for rotations listed oldest first ([R_{i+1}, …, R_j]): frame i → frame j."""
    if not rotations_since_parent:
        raise ValueError("need at least one rotation (pass the identity for no change)")
    total = np.eye(np.asarray(rotations_since_parent[0]).shape[0])
    for rot in rotations_since_parent:
        rot = np.asarray(rot, dtype=np.float64)
        if rot.shape != total.shape:
            raise ValueError(f"rotation of shape {rot.shape}, expected {total.shape}")
        if not np.allclose(rot @ rot.T, np.eye(len(rot)), atol=1e-5):
            raise ValueError("rotations must be orthogonal")
        total = rot @ total
    return total


def map_query_to_ancestor(
    query: np.ndarray, rotations_since_parent: Sequence[np.ndarray]
) -> np.ndarray:
    """Bring queries embedded by version j into the frame of a gallery built by ancestor i < j.

    ``rotations_since_parent`` = [R_{i+1}, …, R_j], each version's recorded rotation since its
    parent (y_k ≈ R_k y_{k−1}); the query's space components map by q_i = (R_j ⋯ R_{i+1})ᵀ q_j,
    the time component is unchanged (a spatial rotation is a Lorentz isometry). An empty list
    (i = j) returns the query as is.
    """
    q = np.asarray(query, dtype=np.float64)
    if not rotations_since_parent:
        return q.astype(np.asarray(query).dtype, copy=True)
    total = accumulated_rotation(rotations_since_parent)
    if q.shape[-1] != total.shape[0]:
        raise ValueError(f"query dimension {q.shape[-1]} does not match rotations {total.shape}")
    # Row vectors: (Tᵀ q)ᵀ = qᵀ T.
    return (q @ total).astype(np.asarray(query).dtype)


# --------------------------------------------------------------------------------------------
# Parameters, state and the training loop
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContinualParams:
    """Settings of one continual task; ``curv``, ``lift_scale``, ``dim`` are fixed at the first.

    Defaults: AdamW without weight decay, one accumulated step per epoch over batches of 1024,
    curvature 0.1, lr 5e-4 (the paper's); ρ = 0.8 (the top of the paper's range), β = 0.1 and
    k_min = 8 inside theirs. lr and 20 epochs were chosen on the first WordNet task's held-out
    recall, where every method trains alike (nothing is protected yet;
    ``python -m bench.continual --sweep-first-task``).
    """

    lr: float = 5e-4
    epochs: int = 20
    batch_size: int = 1024
    temperature: float = 0.07
    entailment_weight: float = 0.2
    weight_decay: float = 0.0
    energy: float = 0.8  # ρ
    min_rank: int = 8  # k_min
    anchor: float = 0.1  # β
    ewc_lambda: float = 1.0
    fisher_batch_size: int = 256
    rotation: str | None = None  # None: DEFAULT_ROTATION[method]
    apex_modality: str | None = None  # None: the first modality
    curv: float = 0.1
    lift_scale: float = 1.0
    dim: int | None = None  # None: the first modality's input dimension

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None) -> ContinualParams:
        """Validate a JSON-ish dict (unknown keys, wrong types and bad ranges are ValueErrors)."""
        params = dict(params or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown}; known: {sorted(known)}")
        defaults = cls()
        clean: dict[str, Any] = {}
        for name, value in params.items():
            default = getattr(defaults, name)
            if value is None:
                if name not in ("rotation", "apex_modality", "dim"):
                    raise ValueError(f"parameter {name!r} must not be null")
                clean[name] = None
            elif name in ("rotation", "apex_modality"):
                if not isinstance(value, str):
                    raise ValueError(f"parameter {name!r} must be a string")
                clean[name] = value
            elif isinstance(default, int) or name == "dim":
                if isinstance(value, bool) or not isinstance(value, int | np.integer):
                    raise ValueError(f"parameter {name!r} must be an integer")
                clean[name] = int(value)
            else:
                if isinstance(value, bool) or not isinstance(value, int | float | np.number):
                    raise ValueError(f"parameter {name!r} must be a number")
                clean[name] = float(value)
        out = cls(**{**asdict(defaults), **clean})
        out.validate()
        return out

    def validate(self) -> None:
        checks = [
            (self.lr > 0 and math.isfinite(self.lr), "lr must be > 0"),
            (self.epochs >= 1, "epochs must be ≥ 1"),
            (self.batch_size >= 2, "batch_size must be ≥ 2"),
            (self.temperature > 0, "temperature must be > 0"),
            (self.entailment_weight >= 0, "entailment_weight must be ≥ 0"),
            (self.weight_decay >= 0, "weight_decay must be ≥ 0"),
            (0 < self.energy <= 1, "energy (ρ) must be in (0, 1]"),
            (self.min_rank >= 0, "min_rank (k_min) must be ≥ 0"),
            (0 < self.anchor < 1, "anchor (β) must be in (0, 1)"),
            (self.ewc_lambda >= 0, "ewc_lambda must be ≥ 0"),
            (self.fisher_batch_size >= 2, "fisher_batch_size must be ≥ 2"),
            (
                self.rotation is None or self.rotation in ROTATION_FITS,
                f"rotation must be one of {list(ROTATION_FITS)}",
            ),
            (self.curv > 0, "curv must be > 0"),
            (self.lift_scale > 0, "lift_scale must be > 0"),
            (self.dim is None or self.dim >= 1, "dim must be ≥ 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass
class ContinualState:
    """Everything needed to continue training from a model version; size independent of #tasks.

    ``second_moments[m]`` = Σ z zᵀ over all rows of all finished tasks (lifted, float64),
    ``fisher[m]`` = EWC's accumulated diagonal Fisher (each task's normalised to mean 1).
    """

    config: dict[str, Any]
    heads: dict[str, Tensor]
    second_moments: dict[str, Tensor]
    row_count: int = 0
    fisher: dict[str, Tensor] = field(default_factory=dict)
    tasks_seen: int = 0

    def model(self) -> LorentzLinearHeads:
        model = LorentzLinearHeads(**self.config)
        with torch.no_grad():
            for name, weight in self.heads.items():
                model.heads[name].copy_(weight)
        model.eval()
        return model

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(
            {
                "type": STATE_TYPE,
                "format": STATE_FORMAT,
                "config": self.config,
                "heads": {k: v.detach().cpu() for k, v in self.heads.items()},
                "second_moments": dict(self.second_moments),
                "row_count": self.row_count,
                "fisher": dict(self.fisher),
                "tasks_seen": self.tasks_seen,
            },
            buf,
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> ContinualState:
        payload = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        if (
            not isinstance(payload, dict)
            or payload.pop("type", None) != STATE_TYPE
            or payload.pop("format", None) != STATE_FORMAT
        ):
            raise ValueError("not a nobackfill continual state (unknown type or format)")
        try:
            return cls(**payload)
        except TypeError as exc:  # missing or extra fields: a damaged or foreign blob
            raise ValueError(f"malformed continual state: {exc}") from exc


@dataclass
class ContinualResult:
    """A finished task: the new model version, the state to continue from, the rotation since the
    parent version (y_new ≈ rotation · y_parent; identity for a first task) and a JSON report."""

    model: LorentzLinearHeads
    state: ContinualState
    rotation: np.ndarray
    report: dict[str, Any]


def contrastive_entailment_loss(
    embeddings: Mapping[str, Tensor],
    curv: float,
    temperature: float,
    entailment_weight: float,
    apex: str,
    labels: Tensor | None = None,
) -> Tensor:
    """Symmetric InfoNCE on −d_L/τ between every pair of modalities (rows paired), averaged over
    pairs, plus ``entailment_weight`` × mean max(0, ext(apex, x) − aper(apex)) for the other
    modalities x (the apex modality's embedding is the cone's apex). With ``labels``, other rows
    of the same label are not used as negatives."""
    names = list(embeddings)
    n = next(iter(embeddings.values())).shape[0]
    target = torch.arange(n)
    same_label = None
    if labels is not None:
        same_label = (labels[:, None] == labels[None, :]) & ~torch.eye(n, dtype=torch.bool)
    contrastive = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            logits = -pairwise_lorentz_distance(embeddings[a], embeddings[b], curv) / temperature
            if same_label is not None:
                logits = logits.masked_fill(same_label, float("-inf"))
            contrastive.append(
                0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
            )
    loss = torch.stack(contrastive).mean()
    if entailment_weight > 0:
        entail = [
            entailment_violation(embeddings[apex], embeddings[m], curv).mean()
            for m in names
            if m != apex
        ]
        loss = loss + entailment_weight * torch.stack(entail).mean()
    return loss


def _validate_task(
    task_features: Mapping[str, np.ndarray], labels: np.ndarray | None
) -> tuple[dict[str, Tensor], Tensor | None]:
    if not isinstance(task_features, Mapping) or len(task_features) < 2:
        raise ValueError("task_features must map at least two modality names to feature arrays")
    tensors: dict[str, Tensor] = {}
    rows = None
    for name, feats in task_features.items():
        arr = np.asarray(feats)
        if arr.ndim != 2 or arr.shape[1] < 1:
            raise ValueError(f"modality {name!r}: features must be a 2-D array (rows × dims)")
        if not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)):
            raise ValueError(f"modality {name!r}: features must be finite numbers")
        if rows is not None and arr.shape[0] != rows:
            raise ValueError("every modality must have the same number of (paired) rows")
        rows = arr.shape[0]
        tensors[name] = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    if rows is None or rows < 2:
        raise ValueError("a task needs at least two paired rows")
    label_tensor = None
    if labels is not None:
        lab = np.asarray(labels)
        if lab.shape != (rows,):
            raise ValueError(f"labels must be a 1-D array of {rows} entries")
        label_tensor = torch.from_numpy(np.unique(lab, return_inverse=True)[1].reshape(-1))
    return tensors, label_tensor


def _new_state(
    features: Mapping[str, Tensor], params: ContinualParams, seed: int
) -> ContinualState:
    input_dims = {name: int(x.shape[1]) for name, x in features.items()}
    dim = params.dim if params.dim is not None else next(iter(input_dims.values()))
    model = LorentzLinearHeads(input_dims, dim, params.curv, params.lift_scale)
    model.init_identity(seed)
    return ContinualState(
        config=model.get_config(),
        heads={k: v.detach().clone() for k, v in model.heads.items()},
        second_moments={
            k: torch.zeros(d + 1, d + 1, dtype=torch.float64) for k, d in input_dims.items()
        },
    )


def _check_compatible(
    state: ContinualState, features: Mapping[str, Tensor], raw_params: Mapping[str, Any]
) -> None:
    dims = state.config["input_dims"]
    if set(features) != set(dims):
        raise ValueError(
            f"task modalities {sorted(features)} differ from the model's {sorted(dims)}"
        )
    for name, x in features.items():
        if x.shape[1] != dims[name]:
            raise ValueError(
                f"modality {name!r}: {x.shape[1]} features, the model takes {dims[name]}"
            )
    for key in ("curv", "lift_scale", "dim"):
        if raw_params.get(key) is not None and raw_params[key] != state.config[key]:
            raise ValueError(f"{key} is fixed at the first task ({state.config[key]})")


class TaskTrainer:
    """One task of continual training, one optimizer step per ``step()`` (one epoch).

    Each step: gradients accumulated over the epoch's batches (plus EWC's penalty once), one AdamW
    step, then — for HMCL with protected data — the admissible correction of the realized
    displacement and the anchoring. AdamW's moments are never touched by the correction.
    """

    def __init__(
        self,
        method: str,
        state: ContinualState | None,
        task_features: Mapping[str, np.ndarray],
        labels: np.ndarray | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {list(METHODS)}")
        self.method = method
        self.params = ContinualParams.from_dict(params)
        self.features, self.labels = _validate_task(task_features, labels)
        if state is None:
            state = _new_state(self.features, self.params, seed)
        else:
            _check_compatible(state, self.features, dict(params or {}))
            # Same order as the model's modalities, whatever order the caller used.
            self.features = {m: self.features[m] for m in state.config["input_dims"]}
        self.parent = state
        apex = self.params.apex_modality or next(iter(self.features))
        if apex not in self.features:
            raise ValueError(f"apex_modality {apex!r} is not one of {list(self.features)}")
        self.apex = apex
        self.rotation_fit = self.params.rotation or DEFAULT_ROTATION[method]
        self.model = state.model()
        self.model.train()
        self.curv = self.model.curv
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.params.lr, weight_decay=self.params.weight_decay
        )
        self.task_start = {k: v.detach().clone() for k, v in self.model.heads.items()}
        self.has_old_data = state.row_count > 0
        self.geometry: ProtectedGeometry | None = None
        self.generator_sum: SkewGenerator | None = None
        if method in ("hmcl-ca", "hmcl-mr") and self.has_old_data:
            geometry = protected_geometry(
                state.second_moments,
                self.task_start,
                self.params.energy,
                self.params.min_rank,
            )
            # Derived in float64; applied in the weights' float32: the correction's rounding
            # (≈1e-7 relative) is far below the AdamW step it corrects.
            self.geometry = geometry.to(torch.float32)
            # Anchored sum of Ω, G ← (1 − β)(G + Ω): the first-order rotation since task start.
            self.generator_sum = SkewGenerator.zeros(geometry.h_vectors)
        self.ewc_active = method == "ewc" and bool(state.fisher) and self.params.ewc_lambda > 0
        self.steps_done = 0
        self.correction_seconds = 0.0
        self.losses: list[float] = []

    def _batches(self) -> list[Tensor]:
        n = next(iter(self.features.values())).shape[0]
        perm = torch.randperm(n, generator=self.generator)
        n_batches = max(1, math.ceil(n / self.params.batch_size))
        # Near-equal batches: a tiny last batch would make an easy, noisy InfoNCE term.
        return list(torch.tensor_split(perm, n_batches))

    def task_loss(self, rows: Tensor) -> Tensor:
        emb = {m: self.model(x[rows], m) for m, x in self.features.items()}
        labels = self.labels[rows] if self.labels is not None else None
        return contrastive_entailment_loss(
            emb,
            self.curv,
            self.params.temperature,
            self.params.entailment_weight,
            self.apex,
            labels,
        )

    def ewc_penalty(self) -> Tensor:
        """(λ/2) Σ F ⊙ (W − W_parent)² over all heads."""
        total = torch.zeros(())
        for name, weight in self.model.heads.items():
            diff = weight - self.task_start[name]
            total = total + (self.parent.fisher[name] * diff * diff).sum()
        return 0.5 * self.params.ewc_lambda * total

    def step(self) -> float:
        """One epoch: accumulate the gradient, AdamW step, correction and anchoring; the loss."""
        batches = self._batches()
        n = sum(len(b) for b in batches)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for rows in batches:
            loss = self.task_loss(rows) * (len(rows) / n)
            loss.backward()
            total += float(loss.detach())
        if self.ewc_active:
            penalty = self.ewc_penalty()
            penalty.backward()
            total += float(penalty.detach())
        if self.geometry is None:
            self.optimizer.step()
        else:
            before = {k: v.detach().clone() for k, v in self.model.heads.items()}
            self.optimizer.step()
            tic = time.perf_counter()
            self._correct_and_anchor(before)
            self.correction_seconds += time.perf_counter() - tic
        self.steps_done += 1
        self.losses.append(total)
        return total

    @torch.no_grad()
    def _correct_and_anchor(self, before: Mapping[str, Tensor]) -> None:
        assert self.geometry is not None and self.generator_sum is not None
        deltas = {k: self.model.heads[k].detach() - before[k] for k in before}
        beta = self.params.anchor
        if self.method == "hmcl-ca":
            corrected, omega = closest_admissible_correction(deltas, self.geometry)
            assert isinstance(omega, SkewGenerator)
            outer = None if omega.outer is None else omega.outer.double()
            omega64 = SkewGenerator(self.generator_sum.basis, omega.inner.double(), outer)
            self.generator_sum = self.generator_sum.scaled_sum(omega64, 1.0 - beta)
        else:
            corrected = minimal_rotation_correction(deltas, self.geometry.bases)
        for name, weight in self.model.heads.items():
            weight.copy_(
                anchor_to_task_start(before[name] + corrected[name], self.task_start[name], beta)
            )

    def fisher_diagonal(self) -> dict[str, Tensor]:
        """Empirical diagonal Fisher of this task at the current weights: mean over batches of
        the squared batch gradient, normalised to mean 1 over all heads (so λ is scale-free)."""
        grads = {k: torch.zeros_like(v) for k, v in self.model.heads.items()}
        n = next(iter(self.features.values())).shape[0]
        perm = torch.randperm(n, generator=self.generator)
        chunks = list(torch.tensor_split(perm, max(1, n // self.params.fisher_batch_size)))
        for rows in chunks:
            self.model.zero_grad(set_to_none=True)
            self.task_loss(rows).backward()
            for k, v in self.model.heads.items():
                grads[k] += v.grad.detach() ** 2 / len(chunks)
        self.model.zero_grad(set_to_none=True)
        mean = torch.cat([g.flatten() for g in grads.values()]).mean()
        # A zero gradient everywhere (a converged toy task) carries no importance at all.
        scale = 1.0 / float(mean) if float(mean) > 0 else 0.0
        return {k: g * scale for k, g in grads.items()}

    def finish(
        self, eval_tasks: Mapping[str, Mapping[str, np.ndarray]] | None = None
    ) -> ContinualResult:
        """Fold this task into the state, record the rotation since the parent, write the report."""
        self.model.eval()
        new_heads = {k: v.detach().clone() for k, v in self.model.heads.items()}
        old_moments = self.parent.second_moments
        candidates: dict[str, Tensor] = {
            "identity": torch.eye(self.model.dim, dtype=torch.float64),
            "generator": torch.eye(self.model.dim, dtype=torch.float64)
            if self.generator_sum is None
            else torch.linalg.matrix_exp(self.generator_sum.dense()),
        }
        residuals: dict[str, float] = {}
        rotation = candidates["identity"]
        if self.has_old_data:
            outputs = OutputMoments.of(self.task_start, new_heads, old_moments)
            candidates["procrustes"] = outputs.procrustes()
            rotation = candidates[self.rotation_fit]
            residuals = {k: outputs.relative_residual(r) for k, r in candidates.items()}
        fisher = dict(self.parent.fisher)
        task_fisher = self.fisher_diagonal()
        for k, v in task_fisher.items():
            fisher[k] = fisher[k] + v if k in fisher else v
        moments = {}
        with torch.no_grad():
            for name, x in self.features.items():
                z = self.model.lifted(x.double(), name)
                moments[name] = old_moments[name] + z.T @ z
        rows = next(iter(self.features.values())).shape[0]
        state = ContinualState(
            config=dict(self.parent.config),
            heads=new_heads,
            second_moments=moments,
            row_count=self.parent.row_count + rows,
            fisher=fisher,
            tasks_seen=self.parent.tasks_seen + 1,
        )
        report = self._report(residuals, eval_tasks, rotation)
        return ContinualResult(state.model(), state, rotation.numpy().copy(), report)

    def _report(
        self,
        residuals: Mapping[str, float],
        eval_tasks: Mapping[str, Mapping[str, np.ndarray]] | None,
        rotation: Tensor,
    ) -> dict[str, Any]:
        params = asdict(self.params)
        params["rotation"] = self.rotation_fit
        params["apex_modality"] = self.apex
        report: dict[str, Any] = {
            "method": self.method,
            "task_index": self.parent.tasks_seen + 1,
            "rows": int(next(iter(self.features.values())).shape[0]),
            "old_rows": int(self.parent.row_count),
            "params": params,
            "steps": self.steps_done,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "correction_seconds": self.correction_seconds,
            # sqrt(Σ‖y_new − R y_parent‖² / Σ‖y_parent‖²) over every old row, exact from moments.
            "old_rows_relative_residual": residuals or None,
        }
        if self.geometry is not None:
            report["protected"] = {
                m: {"rank": int(self.geometry.bases[m].shape[1]), "energy": e}
                for m, e in self.geometry.captured_energy.items()
            }
        if eval_tasks:
            report["eval_tasks"] = self._evaluate_old_tasks(eval_tasks, rotation)
        return report

    def validate_eval_tasks(
        self, eval_tasks: Mapping[str, Mapping[str, np.ndarray]]
    ) -> dict[str, dict[str, Tensor]]:
        """Earlier tasks' paired features as tensors; ValueError unless they fit the model."""
        out = {}
        for task_name, feats in eval_tasks.items():
            try:
                tensors, _ = _validate_task(feats, None)
            except ValueError as exc:
                raise ValueError(f"eval task {task_name!r}: {exc}") from exc
            if set(tensors) != set(self.features):
                raise ValueError(
                    f"eval task {task_name!r}: modalities {sorted(tensors)}, "
                    f"expected {sorted(self.features)}"
                )
            for name, x in tensors.items():
                if x.shape[1] != self.model.input_dims[name]:
                    raise ValueError(f"eval task {task_name!r}: wrong width for {name!r}")
            out[task_name] = tensors
        return out

    def _evaluate_old_tasks(
        self, eval_tasks: Mapping[str, Mapping[str, np.ndarray]], rotation: Tensor
    ) -> dict[str, Any]:
        parent_model = self.parent.model()
        rot = rotation.numpy()
        out: dict[str, Any] = {}
        for task_name, tensors in self.validate_eval_tasks(eval_tasks).items():
            before = {m: parent_model.embed(tensors[m], m) for m in self.features}
            after = {m: self.model.embed(tensors[m], m) for m in self.features}
            names = list(self.features)
            query, gallery = names[0], names[1]
            r_parent = symmetric_recall_at_k(before, self.curv)
            r_new = symmetric_recall_at_k(after, self.curv)
            compensated = map_query_to_ancestor(after[query], [rot])
            out[task_name] = {
                "recall_at_5_parent": r_parent,
                "recall_at_5_new": r_new,
                "retention": r_new / r_parent if r_parent > 0 else None,
                # New queries against the parent's gallery, through the recorded rotation.
                "no_backfill_recall_at_5": paired_recall_at_k(
                    compensated, before[gallery], self.curv
                ),
                "drift": drift_measures(before, after, self.curv),
            }
        return out


def run_continual_task(
    method: str,
    base_state: ContinualState | None,
    task_features: Mapping[str, np.ndarray],
    labels: np.ndarray | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    hooks: TrainingHooks = NO_HOOKS,
    eval_tasks: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> ContinualResult:
    """Train one continual task from ``base_state`` (None: a fresh model) and return the version.

    ``task_features[m]`` is an N×D_m array per modality, rows paired across modalities;
    ``labels`` (optional, length N) keeps same-label rows from being each other's negatives.
    ``eval_tasks`` (optional) maps names of earlier tasks to their paired features: the report
    then holds retention, no-backfill recall and the four drift measures on them (the state keeps
    no raw rows, so only the caller can supply them). ``hooks.check()`` is polled before every
    step and ``hooks.report(epoch, epochs, loss)`` called after it. Unknown methods and bad
    parameters raise ``ValueError``.
    """
    trainer = TaskTrainer(method, base_state, task_features, labels, params=params, seed=seed)
    if eval_tasks:
        trainer.validate_eval_tasks(eval_tasks)  # fail before training, not after
    epochs = trainer.params.epochs
    for epoch in range(epochs):
        hooks.check()
        loss = trainer.step()
        hooks.report(epoch + 1, epochs, loss)
    hooks.check()
    return trainer.finish(eval_tasks)
