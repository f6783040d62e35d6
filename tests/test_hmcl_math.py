"""The HMCL math, pinned: constraint, MR = CA(Ω=0), closed form vs brute force, first-order
invariance of the old geometry, the pull-back bound, and the rotation bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import Tensor

from app.ml.geometry.lorentz import distance_to_origin, pairwise_lorentz_distance, time_component
from app.ml.hmcl import (
    LorentzLinearHeads,
    SkewGenerator,
    accumulated_rotation,
    anchor_to_task_start,
    closest_admissible_correction,
    fit_shared_rotation,
    map_query_to_ancestor,
    minimal_rotation_correction,
    protected_geometry,
    protected_subspace,
    rotation_residual,
    shared_rotation_generator,
    solve_skew_lyapunov,
)

MODALITIES = ("lemma", "gloss")
MINILM = "all-MiniLM-L6-v2"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lifted(x: Tensor, curv: float = 0.1) -> Tensor:
    """Rows z = (z₀, x) on the hyperboloid, for x already the spatial part."""
    return torch.cat([time_component(x, curv)[:, None], x], dim=1)


def _random_problem(
    rows: int, in_dim: int, dim: int, seed: int, time_weight: float = 0.0
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """Random old features X_m (as lifted moments), heads W_m and proposed steps δ_m (float64)."""
    g = _gen(seed)
    feats, heads, deltas = {}, {}, {}
    for m in MODALITIES:
        feats[m] = torch.randn(rows, in_dim, generator=g, dtype=torch.float64)
        head = torch.randn(dim, in_dim + 1, generator=g, dtype=torch.float64)
        head[:, 0] *= time_weight
        heads[m] = head
        deltas[m] = torch.randn(dim, in_dim + 1, generator=g, dtype=torch.float64)
    return feats, heads, deltas


def _moments(feats: dict[str, Tensor]) -> dict[str, Tensor]:
    return {m: _lifted(x).T @ _lifted(x) for m, x in feats.items()}


def _real_features(wordnet_small: dict, rows: slice) -> dict[str, Tensor]:
    """Lifted spatial parts of real MiniLM lemma/gloss features (float64)."""
    model = LorentzLinearHeads({m: 384 for m in MODALITIES}, 384)
    return {
        m: model.lifted(torch.from_numpy(wordnet_small[f"{m}.{MINILM}"][rows]).double(), m)[:, 1:]
        for m in MODALITIES
    }


def _near_identity_heads(g: torch.Generator, time_weight: float = 0.0) -> dict[str, Tensor]:
    """Heads like a trained one on 384-d features: W_s = I + noise, w₀ ~ time_weight."""
    return {
        m: torch.cat(
            [
                time_weight * torch.randn(384, 1, generator=g, dtype=torch.float64),
                torch.eye(384, dtype=torch.float64)
                + 0.05 * torch.randn(384, 384, generator=g, dtype=torch.float64),
            ],
            dim=1,
        )
        for m in MODALITIES
    }


def _assert_constraint(
    feats: dict[str, Tensor],
    heads: dict[str, Tensor],
    deltas: dict[str, Tensor],
    corrected: dict[str, Tensor],
    omega: Tensor,
    tol: float = 1e-6,
) -> None:
    """X_m ΔW_sᵐᵀ = Y_m Ωᵀ and Δw₀ᵐ = 0, relative to the size of each side."""
    for m, x in feats.items():
        y = _lifted(x) @ heads[m].T
        lhs = x @ corrected[m][:, 1:].T
        rhs = y @ omega.T
        scale = max(float(lhs.abs().max()), float(rhs.abs().max()), 1e-300)
        assert float((lhs - rhs).abs().max()) / scale < tol
        assert float(corrected[m][:, 0].abs().max()) == 0.0
        # The rotation is a real part of the step (with Ω = 0 the test would hold trivially).
        raw = x @ deltas[m][:, 1:].T
        assert float(rhs.abs().max()) > 1e-2 * float(raw.abs().max())


def test_protected_subspace_picks_the_smallest_rank_with_the_energy() -> None:
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=_gen(0), dtype=torch.float64))
    evals = torch.tensor([5.0, 3.0, 1.0, 0.5, 0.5, 0.0], dtype=torch.float64)
    moment = q @ torch.diag(evals) @ q.T
    basis, lam, frac = protected_subspace(moment, energy=0.7, min_rank=1)
    assert basis.shape == (6, 2) and frac == pytest.approx(0.8)
    assert torch.allclose(lam, evals[:2])
    assert torch.allclose(basis @ basis.T @ q[:, :2], q[:, :2])
    assert protected_subspace(moment, energy=0.5, min_rank=1)[0].shape[1] == 1
    assert protected_subspace(moment, energy=0.5, min_rank=3)[0].shape[1] == 3  # k_min
    # energy 1 and k_min 6 stop at the numerical rank (5): the null direction is not invertible
    assert protected_subspace(moment, energy=1.0, min_rank=6)[0].shape[1] == 5
    assert protected_subspace(torch.zeros(4, 4, dtype=torch.float64), 0.7, 2)[0].shape == (4, 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ca_constraint_holds_on_random_features(seed: int) -> None:
    # Fewer old rows than dimensions: the protected subspace (ρ = 1) is a proper subspace and
    # the step keeps real freedom outside it.
    feats, heads, deltas = _random_problem(rows=9, in_dim=16, dim=12, seed=seed)
    geometry = protected_geometry(_moments(feats), heads, energy=1.0, min_rank=0)
    corrected, omega = closest_admissible_correction(deltas, geometry)
    _assert_constraint(feats, heads, deltas, corrected, omega.dense())
    # Outside the protected subspace the step is untouched.
    for m in MODALITIES:
        free = torch.eye(16, dtype=torch.float64) - geometry.bases[m] @ geometry.bases[m].T
        assert torch.allclose(corrected[m][:, 1:] @ free, deltas[m][:, 1:] @ free, atol=1e-10)


def test_ca_constraint_holds_on_real_features(wordnet_small: dict) -> None:
    feats = _real_features(wordnet_small, slice(0, 120))
    g = _gen(3)
    heads = _near_identity_heads(g)
    deltas = {m: 1e-3 * torch.randn(384, 385, generator=g, dtype=torch.float64) for m in heads}
    geometry = protected_geometry(_moments(feats), heads, energy=1.0, min_rank=0)
    corrected, omega = closest_admissible_correction(deltas, geometry)
    _assert_constraint(feats, heads, deltas, corrected, omega.dense())


def test_ca_constraint_holds_on_the_protected_part_with_partial_energy(
    wordnet_small: dict,
) -> None:
    """ρ < 1 over all 800 real rows, with a trained-looking w₀ ≠ 0: exact on X_p = X V Vᵀ with
    outputs X_p B_m, B_m the least-squares map; the free part of the step is kept as it was."""
    feats = _real_features(wordnet_small, slice(None))
    g = _gen(4)
    heads = _near_identity_heads(g, time_weight=0.1)
    deltas = {m: torch.randn(384, 385, generator=g, dtype=torch.float64) for m in heads}
    geometry = protected_geometry(_moments(feats), heads, 0.7, 8)
    corrected, omega = closest_admissible_correction(deltas, geometry)
    dense = omega.dense()
    mr = minimal_rotation_correction(deltas, geometry.bases)
    for m in MODALITIES:
        basis = geometry.bases[m]
        assert 8 <= basis.shape[1] < 384
        protected = feats[m] @ basis @ basis.T
        outputs = protected @ geometry.least_squares_map(m)
        lhs = protected @ corrected[m][:, 1:].T
        rhs = outputs @ dense.T
        assert float((lhs - rhs).abs().max()) < 1e-6 * float(lhs.abs().max())
        # P_m B_m is the protected part of X⁺Y and the least-squares map of X_p: its residual is
        # orthogonal to the protected features.
        y = _lifted(feats[m]) @ heads[m].T
        normal = protected.T @ (y - protected @ geometry.least_squares_map(m))
        assert float(normal.abs().max()) < 1e-8 * float((protected.T @ y).abs().max())
        # X is rank-deficient: X⁺Y is the minimum-norm solution (gelsd).
        full_map = torch.linalg.lstsq(feats[m], y, driver="gelsd").solution
        assert torch.allclose(
            basis @ basis.T @ full_map, geometry.least_squares_map(m), atol=1e-8, rtol=1e-6
        )
        # The unprotected part of the step is MR's: CA adds nothing outside span V.
        free = torch.eye(384, dtype=torch.float64) - basis @ basis.T
        assert torch.allclose(corrected[m][:, 1:] @ free, mr[m][:, 1:] @ free, atol=1e-10)
    # Closest: MR (Ω = 0) is admissible too, so CA lands nearer the proposed step.
    dist_ca = sum(float((corrected[m] - deltas[m]).norm() ** 2) for m in MODALITIES) ** 0.5
    dist_mr = sum(float((mr[m] - deltas[m]).norm() ** 2) for m in MODALITIES) ** 0.5
    assert dist_ca < dist_mr


def test_mr_equals_ca_with_rotation_forced_to_zero(wordnet_small: dict) -> None:
    feats = _real_features(wordnet_small, slice(0, 300))
    g = _gen(5)
    heads = {m: torch.randn(64, 385, generator=g, dtype=torch.float64) for m in MODALITIES}
    deltas = {m: torch.randn(64, 385, generator=g, dtype=torch.float64) for m in MODALITIES}
    geometry = protected_geometry(_moments(feats), heads, energy=0.7, min_rank=4)
    mr = minimal_rotation_correction(deltas, geometry.bases)
    ca_dense, _ = closest_admissible_correction(deltas, geometry, torch.zeros(64, 64).double())
    ca_factored, _ = closest_admissible_correction(
        deltas, geometry, SkewGenerator.zeros(geometry.h_vectors)
    )
    ca, _ = closest_admissible_correction(deltas, geometry)
    for m in MODALITIES:
        assert torch.allclose(mr[m], ca_dense[m], atol=1e-12)
        assert torch.allclose(mr[m], ca_factored[m], atol=1e-12)
        # MR keeps old protected features fixed: X_p δᵀ = 0
        protected = feats[m] @ geometry.bases[m]
        assert float((protected @ (mr[m][:, 1:] @ geometry.bases[m]).T).abs().max()) < 1e-10
        assert not torch.allclose(mr[m], ca[m])  # CA does rotate


def _protected_rows(x: np.ndarray, y: np.ndarray, energy: float) -> tuple[np.ndarray, np.ndarray]:
    """X_p = X V Vᵀ (V: top right singular vectors of X carrying a fraction ``energy`` of ‖X‖²)
    and Π Y, the projection of the outputs on X_p's column space — from the rows, with numpy."""
    _, sing, vt = np.linalg.svd(x, full_matrices=False)
    captured = np.cumsum(sing**2) / np.sum(sing**2)
    rank = int(np.searchsorted(captured, energy - 1e-12)) + 1
    rank = min(rank, int(np.sum(sing > 1e-10 * sing[0])))
    x_p = x @ vt[:rank].T @ vt[:rank]
    return x_p, x_p @ np.linalg.pinv(x_p) @ y


def _brute_force(
    feats: dict[str, Tensor],
    heads: dict[str, Tensor],
    deltas: dict[str, Tensor],
    energy: float = 1.0,
) -> tuple[dict[str, Tensor], Tensor]:
    """min Σ‖δ'ᵐ − δᵐ‖² s.t. X_p δ_s'ᵐᵀ = (Π Y_m) Ωᵀ, δ₀'ᵐ = 0, Ω skew (X_p, Π Y_m: see
    ``_protected_rows``; at ρ = 1 with fewer rows than dimensions, X_m δ_s'ᵐᵀ = Y_m Ωᵀ) — solved
    as a generic equality-constrained least-squares problem over (δ', ω) via the constraint's
    null space."""
    dim, in_dim = next(iter(deltas.values())).shape[0], next(iter(feats.values())).shape[1]
    rows = {
        m: _protected_rows(x.numpy(), (_lifted(x) @ heads[m].T).numpy(), energy)
        for m, x in feats.items()
    }
    iu = np.triu_indices(dim, 1)
    n_delta = dim * in_dim
    n_vars = len(MODALITIES) * n_delta + len(iu[0])

    def unpack(u: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        ds = [u[i * n_delta : (i + 1) * n_delta].reshape(dim, in_dim) for i in range(len(feats))]
        omega = np.zeros((dim, dim))
        omega[iu] = u[len(feats) * n_delta :]
        return ds, omega - omega.T

    def constraint(u: np.ndarray) -> np.ndarray:
        ds, omega = unpack(u)
        out = []
        for d, m in zip(ds, MODALITIES, strict=True):
            x, y = rows[m]
            out.append((x @ d.T - y @ omega.T).ravel())
        return np.concatenate(out)

    a = np.stack([constraint(e) for e in np.eye(n_vars)], axis=1)
    null = scipy.linalg.null_space(a)
    select = np.zeros((len(MODALITIES) * n_delta, n_vars))
    select[:, : len(MODALITIES) * n_delta] = np.eye(len(MODALITIES) * n_delta)
    target = np.concatenate([deltas[m][:, 1:].numpy().ravel() for m in MODALITIES])
    coef, *_ = np.linalg.lstsq(select @ null, target, rcond=None)
    ds, omega = unpack(null @ coef)
    return {m: torch.from_numpy(d) for m, d in zip(MODALITIES, ds, strict=True)}, torch.from_numpy(
        omega
    )


@pytest.mark.parametrize("energy", [0.5, 0.8, 1.0])
@pytest.mark.parametrize(
    ("rows", "in_dim", "dim", "seed"),
    [(3, 5, 4, 0), (2, 6, 6, 1), (4, 7, 3, 2), (9, 6, 5, 3), (12, 5, 7, 4)],
)
def test_closed_form_matches_brute_force_constrained_least_squares(
    rows: int, in_dim: int, dim: int, seed: int, energy: float
) -> None:
    """At every ρ, also with more rows than dimensions (then Y ∉ span X: w₀ ≠ 0 adds z₀)."""
    feats, heads, deltas = _random_problem(rows, in_dim, dim, seed, time_weight=0.5)
    geometry = protected_geometry(_moments(feats), heads, energy, 0)
    corrected, omega = closest_admissible_correction(deltas, geometry)
    brute, brute_omega = _brute_force(feats, heads, deltas, energy)
    for m in MODALITIES:
        assert torch.allclose(corrected[m][:, 1:], brute[m], atol=1e-8)
        assert float(corrected[m][:, 0].abs().max()) == 0.0
    # Ω is unique on the range of H (the part that moves old outputs); compare Ω B_mᵀ there.
    for m in MODALITIES:
        b = geometry.least_squares_map(m)
        assert torch.allclose(omega.dense() @ b.T, brute_omega @ b.T, atol=1e-8)


def test_low_rank_generator_equals_dense_lyapunov_solution() -> None:
    # H full rank / nearly full (whole eigenbasis) / low rank (range only, with the Q⊥ terms)
    for rows, dim, seed in [(30, 8, 0), (3, 10, 1), (2, 12, 2)]:
        feats, heads, deltas = _random_problem(rows, 12, dim, seed)
        geometry = protected_geometry(_moments(feats), heads, 0.6, 2)
        h_matrix = sum(c.T @ c for c in geometry.coefficients.values())
        f_matrix = sum(deltas[m][:, 1:] @ geometry.least_squares_map(m) for m in MODALITIES)
        rhs = f_matrix - f_matrix.T
        dense = solve_skew_lyapunov(h_matrix, rhs)
        low_rank = shared_rotation_generator(deltas, geometry).dense()
        assert torch.allclose(low_rank, dense, atol=1e-9)
        assert torch.allclose(low_rank, -low_rank.T, atol=1e-12)
        if geometry.h_vectors.shape[1] == dim:
            assert torch.allclose(low_rank @ h_matrix + h_matrix @ low_rank, rhs, atol=1e-9)
        # The correction through the factors equals the one through dense Ω.
        factored, _ = closest_admissible_correction(deltas, geometry)
        through_dense, _ = closest_admissible_correction(deltas, geometry, low_rank)
        for m in MODALITIES:
            assert torch.allclose(factored[m], through_dense[m], atol=1e-9)


def _random_skew(dim: int, g: torch.Generator) -> Tensor:
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    return a - a.T


@pytest.mark.parametrize("energy", [0.5, 0.8, 1.0])
@pytest.mark.parametrize(
    ("rows", "in_dim", "dim", "seed"), [(30, 12, 8, 0), (3, 12, 10, 1), (9, 6, 5, 3)]
)
def test_ca_is_idempotent_and_keeps_admissible_steps(
    rows: int, in_dim: int, dim: int, seed: int, energy: float
) -> None:
    """H full rank, nearly full and low rank (range-only Ω): CA∘CA = CA, and a step that is
    already admissible (free part anything, protected part Ω₀ B_mᵀP_m) comes back unchanged."""
    feats, heads, deltas = _random_problem(rows, in_dim, dim, seed, time_weight=0.5)
    geometry = protected_geometry(_moments(feats), heads, energy, 1)
    once, _ = closest_admissible_correction(deltas, geometry)
    twice, _ = closest_admissible_correction(once, geometry)
    g = _gen(100 + seed)
    omega0 = _random_skew(dim, g)
    admissible = {}
    for m in MODALITIES:
        scale = float(once[m].abs().max())
        assert torch.allclose(twice[m], once[m], atol=1e-10 * scale)
        basis = geometry.bases[m]
        free = torch.randn(dim, in_dim, generator=g, dtype=torch.float64)
        free = free - free @ basis @ basis.T
        spatial = free + omega0 @ geometry.least_squares_map(m).T @ basis @ basis.T
        admissible[m] = torch.cat([torch.zeros(dim, 1, dtype=torch.float64), spatial], dim=1)
    kept, _ = closest_admissible_correction(admissible, geometry)
    for m in MODALITIES:
        assert torch.allclose(kept[m], admissible[m], atol=1e-9 * float(admissible[m].abs().max()))


def test_ca_is_idempotent_on_a_real_step(wordnet_small: dict) -> None:
    """ρ = 0.8 on real features with a trained-looking w₀: CA twice = CA once (the issue saw a
    59 % change when the rotation term reached outside the protected subspace)."""
    feats = _real_features(wordnet_small, slice(None))
    g = _gen(12)
    heads = _near_identity_heads(g, time_weight=0.1)
    deltas = {m: 1e-3 * torch.randn(384, 385, generator=g, dtype=torch.float64) for m in heads}
    geometry = protected_geometry(_moments(feats), heads, 0.8, 8)
    once, _ = closest_admissible_correction(deltas, geometry)
    twice, _ = closest_admissible_correction(once, geometry)
    for m in MODALITIES:
        change = float((twice[m] - once[m]).norm() / once[m].norm())
        assert change < 1e-9


def _geometry_change(
    feats: dict[str, Tensor], before: dict[str, Tensor], after: dict[str, Tensor]
) -> float:
    """Largest change of a radius or a within/cross-modal Lorentz distance of the old points."""
    old = {m: _lifted(x) @ before[m].T for m, x in feats.items()}
    new = {m: _lifted(x) @ after[m].T for m, x in feats.items()}
    change = 0.0
    for m in MODALITIES:
        change = max(
            change,
            float((distance_to_origin(new[m], 0.1) - distance_to_origin(old[m], 0.1)).abs().max()),
        )
        for n in MODALITIES:
            d_old = pairwise_lorentz_distance(old[m], old[n], 0.1)
            d_new = pairwise_lorentz_distance(new[m], new[n], 0.1)
            change = max(change, float((d_new - d_old).abs().max()))
    return change


def test_old_radii_and_distances_are_unchanged_to_first_order(wordnet_small: dict) -> None:
    feats = _real_features(wordnet_small, slice(0, 60))
    g = _gen(6)
    heads = _near_identity_heads(g)
    direction = {m: torch.randn(384, 385, generator=g, dtype=torch.float64) for m in MODALITIES}
    geometry = protected_geometry(_moments(feats), heads, energy=1.0, min_rank=0)
    ca_change, raw_change = [], []
    for eps in (1e-4, 1e-5):
        step = {m: eps * d for m, d in direction.items()}
        corrected, _ = closest_admissible_correction(step, geometry)
        ca_change.append(
            _geometry_change(feats, heads, {m: heads[m] + corrected[m] for m in heads})
        )
        raw_change.append(_geometry_change(feats, heads, {m: heads[m] + step[m] for m in heads}))
    # Uncorrected: first order (÷10 per ÷10 in ε). Corrected: second order (÷100).
    assert raw_change[0] / raw_change[1] == pytest.approx(10.0, rel=0.05)
    assert ca_change[0] / ca_change[1] == pytest.approx(100.0, rel=0.05)
    assert ca_change[0] < 1e-2 * raw_change[0]


@pytest.mark.parametrize("beta", [0.075, 0.1, 0.2])
def test_pullback_bound_holds_over_many_steps(beta: float) -> None:
    g = _gen(7)
    start = torch.randn(6, 7, generator=g, dtype=torch.float64)
    u_max = 0.3
    bound = (1 - beta) * u_max / beta
    weight, worst = start.clone(), 0.0
    for _ in range(2000):
        step = torch.randn(6, 7, generator=g, dtype=torch.float64)
        step *= u_max * float(torch.rand((), generator=g, dtype=torch.float64)) / step.norm()
        weight = anchor_to_task_start(weight + step, start, beta)
        worst = max(worst, float((weight - start).norm()))
    assert worst <= bound * (1 + 1e-12)
    # The bound is tight: steps of full size in one direction approach it.
    step = torch.randn(6, 7, generator=g, dtype=torch.float64)
    step *= u_max / step.norm()
    weight = start.clone()
    for _ in range(2000):
        weight = anchor_to_task_start(weight + step, start, beta)
    assert float((weight - start).norm()) == pytest.approx(bound, rel=1e-9)
    # Without the pull-back the same steps run away.
    assert float((2000 * step).norm()) > 10 * bound


def _random_rotation(dim: int, seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, dim)))
    return q * np.sign(np.diag(r))


def test_queries_reach_an_ancestor_gallery_through_the_rotation_chain() -> None:
    rng = np.random.default_rng(8)
    gallery = rng.normal(size=(40, 6))  # embedded by version 0
    chain = [_random_rotation(6, s) for s in (1, 2, 3)]  # R_1, R_2, R_3 (each since its parent)
    # Version 3 embeds the same items as R_3 R_2 R_1 x (rows: x (R_3 R_2 R_1)ᵀ).
    total = chain[2] @ chain[1] @ chain[0]
    assert np.allclose(accumulated_rotation(chain), total)
    query_v3 = gallery @ total.T
    assert np.allclose(map_query_to_ancestor(query_v3, chain), gallery)
    # From version 3 to the gallery of version 1 only R_2 and R_3 apply.
    assert np.allclose(map_query_to_ancestor(query_v3, chain[1:]), gallery @ chain[0].T)
    assert np.array_equal(map_query_to_ancestor(gallery, []), gallery)
    # Lorentz distances to the old gallery are those of the old model.
    d_old = pairwise_lorentz_distance(torch.from_numpy(gallery), torch.from_numpy(gallery), 0.1)
    mapped = torch.from_numpy(map_query_to_ancestor(query_v3, chain))
    assert torch.allclose(pairwise_lorentz_distance(mapped, torch.from_numpy(gallery), 0.1), d_old)
    with pytest.raises(ValueError, match="orthogonal"):
        map_query_to_ancestor(query_v3, [np.eye(6) * 1.1])
    with pytest.raises(ValueError):
        map_query_to_ancestor(query_v3, [np.eye(5)])


def test_procrustes_from_moments_matches_the_fit_on_the_rows(wordnet_small: dict) -> None:
    feats = _real_features(wordnet_small, slice(0, 200))
    g = _gen(9)
    old = {m: torch.randn(32, 385, generator=g, dtype=torch.float64) for m in MODALITIES}
    true_rotation = torch.from_numpy(_random_rotation(32, 10))
    new = {
        m: true_rotation @ w + 1e-2 * torch.randn(32, 385, generator=g, dtype=torch.float64)
        for m, w in old.items()
    }
    moments = _moments(feats)
    rotation = fit_shared_rotation(old, new, moments)
    y_old = torch.cat([_lifted(feats[m]) @ old[m].T for m in MODALITIES]).numpy()
    y_new = torch.cat([_lifted(feats[m]) @ new[m].T for m in MODALITIES]).numpy()
    # scipy: argmin ‖A Ω − B‖ for row vectors, A = y_old, B = y_new ⇒ R = Ωᵀ.
    omega, _ = scipy.linalg.orthogonal_procrustes(y_old, y_new)
    assert np.allclose(rotation.numpy(), omega.T, atol=1e-10)
    direct = np.sqrt(((y_new - y_old @ omega) ** 2).sum() / (y_old**2).sum())
    assert rotation_residual(rotation, old, new, moments) == pytest.approx(direct, rel=1e-8)
    identity = rotation_residual(torch.eye(32, dtype=torch.float64), old, new, moments)
    assert identity > 10 * direct
