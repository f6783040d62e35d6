"""The admissible update of HMCL (algorithms §4): protected subspaces, the least-squares maps,
the skew Lyapunov solve and the MR / CA corrections of a proposed step, and task anchoring.

Pure tensor functions in any float type; see ``closest_admissible_correction`` for the
admissible set and the derivation of the closest point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# Eigenvalues below this fraction of the largest are treated as 0 (the data's span ends there):
# inverting them would turn float64 rounding into huge, meaningless rotations.
RANK_TOL = 1e-10


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


def residual_output_moment(
    second_moment_lifted: Tensor, head: Tensor, basis: Tensor, coefficients: Tensor
) -> Tensor:
    """M_r = Σ y_r y_rᵀ (d×d) over the old rows of the part of their outputs the protected
    features do not explain: y_r = W z − Cᵀ Vᵀ x (Y_r = Y − X_p B, the free features' share and
    whatever of the w₀ z₀ column X_p does not reproduce), from the moments: Y_r = Z A with
    A = Wᵀ − [0; V C], so M_r = Aᵀ (Σ z zᵀ) A."""
    lifted = head.T.clone()
    lifted[1:] -= basis @ coefficients
    return lifted.T @ second_moment_lifted @ lifted


def residual_rotation_cost(
    h_matrix: Tensor, residual: Tensor, protected_output: float, weight: float
) -> Tensor:
    """μ H_r with H_r = M_r · tr H / Σ tr(C_mᵀΛ_mC_m): the residual outputs' second moment in
    the units of H.

    Why. CA moves the protected outputs X_pB by the rotation I + Ω and leaves the rest of every
    old output, Y_r = Y − X_pB, where it was: the old rows then separate by ‖Y_rΩᵀ‖, which is
    not a rotation (drift), and the Lyapunov solution Ω̃_ij = K_ij / (h_i + h_j) is largest
    exactly where H is small: in output directions the protected part hardly spans but Y_r may.
    Adding μ‖ΩC_rᵀ‖² (C_rᵀC_r = H_r) to Σ‖ΩC_mᵀ − δ_sᵐV_m‖² prices that separation: the
    minimiser over skew Ω solves Ω(H + μH_r) + (H + μH_r)Ω = F − Fᵀ, and the step stays
    admissible (δ_s* = δ_s(I − P) + ΩCᵀVᵀ for whatever Ω). tr H / Σ tr(CᵀΛC) converts an output
    moment into H's units: ‖ΩCᵀ‖² costs tr(ΩHΩᵀ) in parameters and tr(ΩCᵀΛCΩᵀ) in outputs.
    μ = 0 is the closest admissible step itself.
    """
    return weight * residual * (float(torch.trace(h_matrix)) / protected_output)


def protected_geometry(
    second_moments: Mapping[str, Tensor],
    heads: Mapping[str, Tensor],
    energy: float,
    min_rank: int,
    rank_tol: float = RANK_TOL,
    residual_weight: float = 0.0,
) -> ProtectedGeometry:
    """Protected bases, least-squares maps and H's eigenbasis from lifted second moments Σ z zᵀ
    (computed in float64 whatever the inputs' type).

    Only the protected part P_m B_m = V_m C_m of the least-squares map B_m = X_m⁺Y_m enters the
    closest admissible update; C_m = Λ_m⁻¹V_mᵀ(Σ x zᵀ)W_mᵀ needs no other eigenvector of XᵀX.

    ``residual_weight`` μ > 0 solves the Lyapunov equation with H + μH_r instead of H
    (``residual_rotation_cost``): Ω then also pays for what it does *not* rotate.
    """
    bases, coefs, captured = {}, {}, {}
    dim = next(iter(heads.values())).shape[0]
    h_matrix = torch.zeros(dim, dim, dtype=torch.float64)
    residual = torch.zeros(dim, dim, dtype=torch.float64)
    protected_output = 0.0
    for name, moment in second_moments.items():
        moment = moment.double()
        basis, evals, frac = protected_subspace(moment[1:, 1:], energy, min_rank, rank_tol)
        coef = least_squares_coefficients(moment, basis, evals, heads[name].double())
        bases[name], coefs[name], captured[name] = basis, coef, frac
        h_matrix += coef.T @ coef
        if residual_weight > 0:
            residual += residual_output_moment(moment, heads[name].double(), basis, coef)
            protected_output += float((coef.T * (evals[:, None] * coef).T).sum())
    if residual_weight > 0 and protected_output > 0:
        h_matrix = h_matrix + residual_rotation_cost(
            h_matrix, residual, protected_output, residual_weight
        )
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
