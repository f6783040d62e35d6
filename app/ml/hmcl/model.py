"""The continual model (one bias-free Lorentz linear head per modality on frozen lifted
features), the state a lineage continues from, and a finished task's result."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from app.ml.geometry.lorentz import time_component
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.models import EmbeddingModel

STATE_FORMAT = 1
STATE_TYPE = "nobackfill-continual-state"


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
