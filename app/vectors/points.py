"""Space components of stored vectors: the fixed Euclidean lift of an external gallery (``lift``
of ``app.ml.geometry.space``), or the vectors as stored for a model-bound gallery (already components)."""

from __future__ import annotations

import numpy as np
import torch

from app.ml.geometry.space import EuclideanLift
from app.vectors.engine import StoredGallery


def lift_of(gallery: StoredGallery) -> EuclideanLift:
    return EuclideanLift(curv=gallery.lift_curv, scale=gallery.lift_scale, metric=gallery.metric)


def lifted_points(gallery: StoredGallery, stored: np.ndarray) -> np.ndarray:
    """Space components of stored vectors: the lift for external galleries, as-is otherwise."""
    if gallery.bound_model_id is not None:
        return stored
    x = torch.tensor(stored, dtype=torch.float64)
    return lift_of(gallery)(x).numpy().astype(np.float32)
