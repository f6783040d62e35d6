"""Settings of one continual task (``ContinualParams``) and the method names."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

METHODS = ("hmcl-ca", "hmcl-mr", "finetune", "ewc")
ROTATION_FITS = ("identity", "procrustes", "generator")
# The recorded rotation when the caller does not choose: only CA rotates old embeddings on purpose.
DEFAULT_ROTATION = {
    "hmcl-ca": "procrustes",
    "hmcl-mr": "identity",
    "finetune": "identity",
    "ewc": "identity",
}


@dataclass(frozen=True)
class ContinualParams:
    """Settings of one continual task; ``curv``, ``lift_scale``, ``dim`` are fixed at the first.

    Defaults: AdamW without weight decay, one step per mini-batch of ``batch_size`` rows, at
    least ``epochs`` epochs and at least ``min_steps`` steps (small tasks get more epochs),
    curvature 0.1, lr 5e-4 (the paper's); ρ = 0.8 (the top of the paper's range), β = 0.1 and
    k_min = 8 inside theirs. HMCL corrects every step and anchors once per epoch. CA's Ω also
    pays for the old outputs it leaves unrotated with weight μ = 1, the unit that prices them
    like the protected ones (``residual_rotation_cost``; μ = 0: the bare closest admissible step,
    which let Ω grow far past a small rotation: ``tests/test_hmcl_interleaved.py``).
    """

    lr: float = 5e-4
    epochs: int = 20
    batch_size: int = 256
    min_steps: int = 200
    temperature: float = 0.07
    entailment_weight: float = 0.2
    weight_decay: float = 0.0
    energy: float = 0.8  # ρ
    min_rank: int = 8  # k_min
    anchor: float = 0.1  # β
    residual_weight: float = 1.0  # μ: CA's price on the old outputs' unrotated residual
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
            (self.min_steps >= 0, "min_steps must be ≥ 0"),
            (self.temperature > 0, "temperature must be > 0"),
            (self.entailment_weight >= 0, "entailment_weight must be ≥ 0"),
            (self.weight_decay >= 0, "weight_decay must be ≥ 0"),
            (0 < self.energy <= 1, "energy (ρ) must be in (0, 1]"),
            (self.min_rank >= 0, "min_rank (k_min) must be ≥ 0"),
            (0 < self.anchor < 1, "anchor (β) must be in (0, 1)"),
            (
                self.residual_weight >= 0 and math.isfinite(self.residual_weight),
                "residual_weight (μ) must be ≥ 0",
            ),
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
