"""HMCL: admissible continual updates of Lorentz linear heads (arXiv 2609.29329; algorithms §4).

Each modality m has a frozen encoder whose features e are lifted onto the hyperboloid,
z = (z₀, z_s) with z_s = exp₀(s·e/‖e‖) (``space.EuclideanLift``), and a bias-free Lorentz linear
head f(W; z) = [sqrt(K + ‖Wz‖²); Wz] with W = [w₀ W_s] ∈ R^{d×(D+1)}, K = 1/c. Old geometry
(radii, distances within and across modalities) is kept iff every modality's old embeddings move
by one shared spatial rotation; to first order, with X_m the old features' spatial part and Y_m
their head outputs: Δw₀ᵐ = 0 and X_m ΔW_sᵐᵀ = Y_m Ωᵀ for one skew Ω.

After every AdamW (mini-batch) step the realized displacement δᵐ = W̃ᵐ − Wᵐ is replaced by the closest
admissible one (the moments stay as AdamW left them):
- ``hmcl-mr`` (Ω = 0): δ_sᵐ ← δ_sᵐ(I − P_m), δ₀ᵐ ← 0, P_m = V_m V_mᵀ the protected subspace;
- ``hmcl-ca``: δ_sᵐ ← δ_sᵐ(I − P_m) + Ω B_mᵀP_m, δ₀ᵐ ← 0, B_m = X_m⁺Y_m the least-squares map and
  Ω the skew solution of ΩH + HΩ = F − Fᵀ, H = Σ B_mᵀP_mB_m, F = Σ δ_sᵐ P_m B_m (the closest
  admissible update at every ρ: see ``closest_admissible_correction``);
and once per epoch the anchoring W ← βW_task_start + (1 − β)W. Where nothing is protected yet
(a lineage's first task) there is no correction and no anchoring. ``finetune`` (plain AdamW) and ``ewc``
(AdamW on the loss plus a diagonal-Fisher penalty) are the baselines, on the same schedule.

The continual state keeps, per modality, only the accumulated **uncentred** second moment of the
old lifted features, Σ z zᵀ ((D+1)×(D+1)), its row count, and EWC's diagonal Fisher; the protected
basis V_m and the least-squares map B_m are derived from it and the current head at each task
start (B_m = (Σ x xᵀ)⁺ Σ x zᵀ Wᵐᵀ is exact given the moments). No raw feature is kept, so the
state's size does not depend on the number of tasks.

The recorded rotation (what it guarantees, precisely). Each version records one orthogonal R
(``rotation``: "procrustes", the default for CA; "identity", the default otherwise; or
"generator", exp of the anchored sum of Ω). The Procrustes R minimises, over all orthogonal
matrices, e² = Σ‖y_new − R·y_parent‖² over **every** row of every earlier task and modality
(exact from the stored moments, no raw row kept); the report gives sqrt(e² / Σ‖y_parent‖²) for
each candidate (``old_rows_relative_residual``). Nothing beyond that minimum is promised: the
admissibility constraint makes the protected part of the old outputs move by one shared rotation
to first order only, and the unprotected part (energy 1 − ρ), second-order terms and anchoring
leave the residual. What it buys: on the hyperboloid ds² = ‖dx‖² − (x·dx)²/x₀² ≤ ‖dx‖², so the
Lorentz distance is at most the Euclidean distance of the space components, and a query mapped
into the parent's frame, Rᵀy_new, lies within d_L ≤ ‖y_new − R·y_parent‖ of where the parent put
the same item; across versions i → j (``map_query_to_ancestor``) these per-version distances add
up (triangle inequality; rotations keep norms). The "generator" option is only first order and,
where H is nearly singular, large in directions the old outputs barely span: measured on WordNet
it explained the old rows' motion worse than no rotation at all, so it stays an option whose
residual every report shows.

This module re-exports the public names of the parts: ``hmcl_geometry`` (the admissible update),
``hmcl_rotations`` (rotations between versions), ``hmcl_params`` (settings), ``hmcl_model``
(heads, state, result) and ``hmcl_trainer`` (one task's training loop and report).
"""

from app.ml.hmcl.geometry import (
    RANK_TOL,
    ProtectedGeometry,
    SkewGenerator,
    anchor_to_task_start,
    closest_admissible_correction,
    least_squares_coefficients,
    minimal_rotation_correction,
    protected_geometry,
    protected_subspace,
    shared_rotation_generator,
    solve_skew_lyapunov,
)
from app.ml.hmcl.model import (
    STATE_FORMAT,
    STATE_TYPE,
    ContinualResult,
    ContinualState,
    LorentzLinearHeads,
)
from app.ml.hmcl.params import DEFAULT_ROTATION, METHODS, ROTATION_FITS, ContinualParams
from app.ml.hmcl.rotations import (
    OutputMoments,
    accumulated_rotation,
    fit_shared_rotation,
    map_query_to_ancestor,
    rotation_residual,
)
from app.ml.hmcl.trainer import TaskTrainer, contrastive_entailment_loss, run_continual_task

__all__ = [
    "DEFAULT_ROTATION",
    "METHODS",
    "RANK_TOL",
    "ROTATION_FITS",
    "STATE_FORMAT",
    "STATE_TYPE",
    "ContinualParams",
    "ContinualResult",
    "ContinualState",
    "LorentzLinearHeads",
    "OutputMoments",
    "ProtectedGeometry",
    "SkewGenerator",
    "TaskTrainer",
    "accumulated_rotation",
    "anchor_to_task_start",
    "closest_admissible_correction",
    "contrastive_entailment_loss",
    "fit_shared_rotation",
    "least_squares_coefficients",
    "map_query_to_ancestor",
    "minimal_rotation_correction",
    "protected_geometry",
    "protected_subspace",
    "rotation_residual",
    "run_continual_task",
    "shared_rotation_generator",
    "solve_skew_lyapunov",
]
