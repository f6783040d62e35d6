"""Heads that put backbone features on the hyperboloid of an old embedding space.

Every head computes a tangent vector at the origin, v = α·net(x), and returns exp₀(v) (space
components). ``LorentzHead`` is a trained network (linear or MLP); ``AdapterHead`` is the query-side
adapter family (a fixed Procrustes projection plus an optional trainable low-rank or residual-MLP
correction). Euclidean baselines train the same heads with losses on the tangent vector log₀(h),
which for an external gallery is exactly the old Euclidean space scaled by the lift.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from app.ml.geometry.lorentz import exp_map0
from app.ml.methods.models import EmbeddingModel

# The learnable scale α lives in [e^-6, e^3]: the lower bound keeps the head from collapsing every
# point onto the origin (where cones are widest and carry no information); the upper bound keeps
# exp₀ far from its float32 saturation.
MIN_LOG_SCALE = -6.0
MAX_LOG_SCALE = 3.0


def _mlp(input_dim: int, hidden_dim: int, output_dim: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(input_dim, hidden_dim),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(hidden_dim, output_dim),
    )


class _TangentHead(EmbeddingModel):
    """Shared part: a learnable log-scale and the exp map. Subclasses implement ``tangent``."""

    def __init__(self, input_dim: int, output_dim: int, curv: float, init_scale: float) -> None:
        super().__init__()
        if input_dim < 1 or output_dim < 1:
            raise ValueError("input_dim and output_dim must be ≥ 1")
        if not curv > 0 or not init_scale > 0:
            raise ValueError("curv and init_scale must be > 0")
        self._input_dim, self._output_dim = int(input_dim), int(output_dim)
        self.curv = float(curv)
        self.init_scale = float(init_scale)
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))

    def input_dim(self, modality: str | None = None) -> int:
        self.resolve_modality(modality)
        return self._input_dim

    @property
    def output_dim(self) -> int:
        return self._output_dim

    @property
    def scale(self) -> Tensor:
        return torch.exp(torch.clamp(self.log_scale, MIN_LOG_SCALE, MAX_LOG_SCALE))

    def tangent_unscaled(self, features: Tensor) -> Tensor:
        raise NotImplementedError

    def tangent(self, features: Tensor) -> Tensor:
        """v = α·net(x): the tangent vector at the origin (Euclidean losses act here)."""
        return self.scale * self.tangent_unscaled(features)

    def forward(self, features: Tensor, modality: str | None = None) -> Tensor:
        self.resolve_modality(modality)
        return exp_map0(self.tangent(features), self.curv)


class LorentzHead(_TangentHead):
    """exp₀(α·net(x)) with net linear (``hidden_dim=0``) or a one-hidden-layer GELU MLP."""

    kind = "lorentz-head"

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        hidden_dim: int = 1024,
        curv: float = 1.0,
        init_scale: float = 1.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(input_dim, output_dim, curv, init_scale)
        self.hidden_dim, self.dropout = int(hidden_dim), float(dropout)
        self.net: nn.Module = (
            _mlp(input_dim, hidden_dim, output_dim, dropout)
            if hidden_dim > 0
            else nn.Linear(input_dim, output_dim)
        )

    def get_config(self) -> dict[str, Any]:
        return {
            "input_dim": self._input_dim,
            "output_dim": self._output_dim,
            "hidden_dim": self.hidden_dim,
            "curv": self.curv,
            "init_scale": self.init_scale,
            "dropout": self.dropout,
        }

    def tangent_unscaled(self, features: Tensor) -> Tensor:
        return self.net(features)


class AdapterHead(_TangentHead):
    """Query-side adapter: exp₀(α·(x P + b + low-rank(x) + residual-MLP(x))).

    P (input×output) is fixed, fitted in closed form (orthogonal Procrustes, a semi-orthogonal
    projection when the dimensions differ); ``rank`` adds a trainable x A B, ``residual_hidden`` a
    trainable residual MLP — the Drift-Adapter family (procrustes / affine / mlp-adapter).
    """

    kind = "adapter-head"

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        rank: int = 0,
        residual_hidden: int = 0,
        curv: float = 1.0,
        init_scale: float = 1.0,
    ) -> None:
        super().__init__(input_dim, output_dim, curv, init_scale)
        self.rank, self.residual_hidden = int(rank), int(residual_hidden)
        self.register_buffer("projection", torch.zeros(input_dim, output_dim))
        self.bias = nn.Parameter(torch.zeros(output_dim))
        self.low_rank_in = nn.Parameter(torch.zeros(input_dim, rank)) if rank > 0 else None
        self.low_rank_out = nn.Parameter(torch.zeros(rank, output_dim)) if rank > 0 else None
        self.residual = (
            _mlp(input_dim, residual_hidden, output_dim, 0.0) if residual_hidden > 0 else None
        )
        if self.low_rank_in is not None:
            # B = 0 makes the adapter start at the closed-form map; A random lets gradients flow.
            nn.init.normal_(self.low_rank_in, std=input_dim**-0.5)
        if self.residual is not None:
            last = self.residual[-1]
            assert isinstance(last, nn.Linear)
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)

    def get_config(self) -> dict[str, Any]:
        return {
            "input_dim": self._input_dim,
            "output_dim": self._output_dim,
            "rank": self.rank,
            "residual_hidden": self.residual_hidden,
            "curv": self.curv,
            "init_scale": self.init_scale,
        }

    def tangent_unscaled(self, features: Tensor) -> Tensor:
        out = features @ self.projection + self.bias
        if self.low_rank_in is not None and self.low_rank_out is not None:
            out = out + (features @ self.low_rank_in) @ self.low_rank_out
        if self.residual is not None:
            out = out + self.residual(features)
        return out


class ClassConditionalHead(_TangentHead):
    """Class-conditional map: exp₀(α·(x P + b + Σ_k g_k(x)·x A_k B_k)).

    P is the fixed Procrustes projection (as in ``AdapterHead``). K experts each add a trainable
    rank-r correction x A_k B_k; the gate g(x) = softmax_k(cos(x, c_k) / ``gate_temperature``)
    weighs them by how close x lies to centroid c_k (trainable; the trainer starts them at
    clusters of the class means, so each expert serves a group of classes). B = 0 at the start:
    the head begins as the Procrustes map. Computed as two matrix products over the stacked
    experts, x A (N×K·r), gated, then · B (K·r×out), so memory is N·K·r, not N·K·out.
    """

    kind = "class-conditional-head"

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        experts: int,
        rank: int,
        curv: float = 1.0,
        init_scale: float = 1.0,
        gate_temperature: float = 0.1,
    ) -> None:
        super().__init__(input_dim, output_dim, curv, init_scale)
        if experts < 1 or rank < 1:
            raise ValueError("experts and rank must be ≥ 1")
        if not gate_temperature > 0:
            raise ValueError("gate_temperature must be > 0")
        self.experts, self.rank = int(experts), int(rank)
        self.gate_temperature = float(gate_temperature)
        self.register_buffer("projection", torch.zeros(input_dim, output_dim))
        self.bias = nn.Parameter(torch.zeros(output_dim))
        self.centroids = nn.Parameter(torch.randn(experts, input_dim))
        self.experts_in = nn.Parameter(torch.randn(input_dim, experts * rank) * input_dim**-0.5)
        self.experts_out = nn.Parameter(torch.zeros(experts * rank, output_dim))

    def get_config(self) -> dict[str, Any]:
        return {
            "input_dim": self._input_dim,
            "output_dim": self._output_dim,
            "experts": self.experts,
            "rank": self.rank,
            "curv": self.curv,
            "init_scale": self.init_scale,
            "gate_temperature": self.gate_temperature,
        }

    def gate(self, features: Tensor) -> Tensor:
        """g(x): N×K, each row a softmax over the experts."""
        cosine = (
            nn.functional.normalize(features, dim=-1)
            @ nn.functional.normalize(self.centroids, dim=-1).T
        )
        return torch.softmax(cosine / self.gate_temperature, dim=-1)

    def tangent_unscaled(self, features: Tensor) -> Tensor:
        n = features.shape[0]
        low = (features @ self.experts_in).view(n, self.experts, self.rank)
        gated = (low * self.gate(features).unsqueeze(-1)).reshape(n, self.experts * self.rank)
        return features @ self.projection + self.bias + gated @ self.experts_out


def orthogonal_procrustes(source: Tensor, target: Tensor) -> tuple[Tensor, float]:
    """argmin_{W: WᵀW = I} ‖source·W − target‖_F and the best scalar s for s·source·W ≈ target.

    source N×D, target N×d: W = U Vᵀ from the thin SVD sourceᵀtarget = U Σ Vᵀ, and
    s = tr(Σ)/‖source‖². With D ≥ d the columns of W are orthonormal (a projection); with D < d
    its rows are (an isometric embedding).
    """
    s64, t64 = source.double(), target.double()
    cross = s64.T @ t64
    u, sigma, vh = torch.linalg.svd(cross, full_matrices=False)
    w = u @ vh
    scale = float(sigma.sum() / torch.clamp((s64 * s64).sum(), min=1e-12))
    return w.to(source.dtype), scale


def centred_orthogonal_procrustes(source: Tensor, target: Tensor) -> tuple[Tensor, float, Tensor]:
    """Orthogonal Procrustes with a scale and an offset: W, s and b with s·(x·W) + b ≈ t.

    With μ_s, μ_t the means of the source (N×D) and target (N×d) rows, W = U Vᵀ from the thin
    SVD (source − μ_s)ᵀ(target − μ_t) = U Σ Vᵀ, s = tr(Σ)/‖source − μ_s‖² (the norm clamped at
    1e-12, as ``orthogonal_procrustes`` clamps it) and b = μ_t − s·μ_s·W. ``orthogonal_procrustes``
    fits through the origin, so an offset between the two spaces' means is left in its residual
    and also bends W and s toward fitting it; centring first removes both.
    """
    s64, t64 = source.double(), target.double()
    source_mean, target_mean = s64.mean(dim=0), t64.mean(dim=0)
    w, scale = orthogonal_procrustes(s64 - source_mean, t64 - target_mean)
    bias = target_mean - scale * (source_mean @ w)
    return w.to(source.dtype), scale, bias.to(source.dtype)
