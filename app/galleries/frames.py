"""How a model's queries enter a gallery's frame: the same space for a backbone model and an
external gallery of its old model, its own vectors for a model-bound gallery, the recorded
rotations down a continual model's lineage; anything else is a 409."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sqlalchemy.orm import Session

from app.core.errors import conflict
from app.galleries.models import Gallery
from app.models.models import TrainedModel
from app.models.service import BACKBONE, lineage, query_to_ancestor

FrameMap = Callable[[np.ndarray], np.ndarray]


def same_space(row: TrainedModel, gallery: Gallery) -> bool:
    """A backbone model searches every external gallery of the space it was trained against:
    same old model name and dimension, and the same lift into the Lorentz frame."""
    return (
        gallery.bound_model_id is None
        and row.space_model_name == gallery.model_name
        and row.space_dim == gallery.dim
        and row.lift == gallery_lift(gallery)
    )


def gallery_lift(gallery: Gallery) -> dict | None:
    if gallery.bound_model_id is not None:
        return None
    return {"curv": gallery.lift_curv, "scale": gallery.lift_scale, "metric": gallery.metric}


def frame_map(session: Session, row: TrainedModel, gallery: Gallery) -> FrameMap:
    """How a query embedded by ``row`` enters ``gallery``'s frame, or 409 if it cannot."""
    if gallery.bound_model_id == row.id:
        return lambda points: points
    if row.kind == BACKBONE:
        if same_space(row, gallery):
            return lambda points: points
        raise conflict(
            f"model {row.id} was trained for the space of {row.space_model_name!r} "
            f"(dim {row.space_dim}, lift {row.lift}); gallery {gallery.id} holds "
            + (
                f"{gallery.model_name!r} vectors (dim {gallery.dim}, lift {gallery_lift(gallery)})"
                if gallery.bound_model_id is None
                else f"vectors of model {gallery.bound_model_id}"
            )
        )
    chain = lineage(session, row)
    ids = [m.id for m in chain]
    if gallery.bound_model_id not in ids:
        raise conflict(
            f"model {row.id} can search galleries of its own lineage (versions {ids}); gallery "
            f"{gallery.id} is not bound to one of them"
        )
    return query_to_ancestor(chain[: ids.index(gallery.bound_model_id) + 1])
