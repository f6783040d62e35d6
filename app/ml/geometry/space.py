"""The hyperbolic frame of an old embedding space, and how Euclidean vectors enter it.

An external gallery (vectors from an old model nobody trained here) is lifted onto the hyperboloid
by h = exp₀(scale · f), with f unit-normalised for cosine galleries. The scale is fixed when the
gallery is created: every model trained against that space, and every query, uses the same lift, so
old vectors are never re-embedded. For unit-norm vectors all points share the radius ``scale`` and
the Lorentz distance is increasing in the angle, so old→old rankings equal cosine rankings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from app.ml.geometry.lorentz import exp_map0

Metric = Literal["cosine", "dot"]
# Radius of lifted unit vectors. Measured in bench.quality.compat (see BENCHMARKS.md): large enough that
# entailment cones of radius-κ=0.1 apexes are informative, small enough for exact float32 search.
DEFAULT_LIFT_SCALE = 1.0
DEFAULT_CURVATURE = 1.0


@dataclass(frozen=True)
class EuclideanLift:
    """Fixed lift of Euclidean vectors into the Lorentz model: exp₀(scale · f) (f normalised for
    cosine)."""

    curv: float = DEFAULT_CURVATURE
    scale: float = DEFAULT_LIFT_SCALE
    metric: Metric = "cosine"

    def __post_init__(self) -> None:
        if not self.curv > 0:
            raise ValueError("curv must be > 0")
        if not self.scale > 0:
            raise ValueError("scale must be > 0")
        if self.metric not in ("cosine", "dot"):
            raise ValueError("metric must be 'cosine' or 'dot'")

    def prepare(self, vectors: Tensor) -> Tensor:
        """The Euclidean vector the lift starts from (unit-normalised for cosine galleries)."""
        if self.metric == "cosine":
            # A zero vector has no direction; clamping keeps it at the origin instead of NaN.
            return vectors / torch.clamp(torch.norm(vectors, dim=-1, keepdim=True), min=1e-12)
        return vectors

    def __call__(self, vectors: Tensor) -> Tensor:
        return exp_map0(self.scale * self.prepare(vectors), self.curv)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EuclideanLift:
        return cls(**data)
