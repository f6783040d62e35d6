"""What a finished trainer hands back to the job runner to store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.ml.methods.models import EmbeddingModel


@dataclass
class TrainedOutput:
    model: EmbeddingModel
    report: dict[str, Any]
    params: dict[str, Any]
    kind: str
    # The method actually served, when the job's names a choice (``auto``: the chosen candidate).
    method: str | None = None
    # Backbone models: the old space they search (space_model_name, space_dim, lift, gallery).
    space: dict[str, Any] = field(default_factory=dict)
    # Continual versions: lineage, the rotation since the parent and the state to continue from.
    parent_id: str | None = None
    root_id: str | None = None
    depth: int = 0
    rotation: np.ndarray | None = None
    state: bytes | None = None
