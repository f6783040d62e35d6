"""Attaching a Qdrant collection as a gallery: checked, described, its ids mapped; no vector
copied. The gallery then reads the collection through ``app.vectors.qdrant_storage`` like any
storage, and refuses writes (``refuse_writes``): the collection belongs to its owner."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.core.db import new_id
from app.core.errors import Problem, invalid
from app.core.settings import Settings
from app.galleries.models import Gallery
from app.galleries.schemas import GalleryCreate
from app.ml.geometry.space import DEFAULT_CURVATURE, DEFAULT_LIFT_SCALE
from app.vectors import qdrant_ids
from app.vectors.engine import QDRANT
from app.vectors.faiss_index import validate_index_params
from app.vectors.qdrant_source import QdrantSource, describe
from app.vectors.qdrant_storage import qdrant_storage, read_only


def refuse_writes(gallery: Gallery) -> None:
    """409 for an item upload or delete on an attached gallery, before anything is read."""
    if gallery.vector_storage == QDRANT:
        raise read_only(gallery.id)


def attach_gallery(
    session: Session, settings: Settings, tenant_id: str, request: GalleryCreate
) -> Gallery:
    """The gallery row of an attached collection (staged; the caller commits), after the checks
    of ``describe`` (reachable, collection, vector, Cosine) and the service's own limits."""
    assert request.source is not None
    given = request.source
    if given.path is not None and settings.job_runner == "celery":
        # Local mode locks its folder to one process: the worker could never open it.
        raise invalid(
            "source.path",
            "an embedded Qdrant folder opens in one process only, and this service trains in "
            "Celery workers: attach a Qdrant server (url) instead",
        )
    source = QdrantSource(
        collection=given.collection,
        url=given.url,
        path=given.path,
        vector=given.vector,
        api_key_env=given.api_key_env,
    )
    shape = describe(settings, source)
    if shape.dim > settings.max_dim:
        raise invalid("source.collection", f"its dimension {shape.dim} exceeds {settings.max_dim}")
    scale = request.lift_scale or DEFAULT_LIFT_SCALE
    if scale > settings.max_radius:
        raise invalid("lift_scale", f"lifted vectors would lie beyond radius {settings.max_radius}")
    kind = request.index or settings.default_index_kind
    try:
        params = validate_index_params(kind, request.index_params or {})
    except ValueError as exc:
        raise invalid("index_params", str(exc)) from exc
    gallery = Gallery(
        id=new_id("gal"),
        tenant_id=tenant_id,
        name=request.name,
        dim=shape.dim,
        model_name=request.model_name,
        metric="cosine",
        lift_scale=scale,
        lift_curv=request.curv or DEFAULT_CURVATURE,
        # The index kind only says exact (flat) or the collection's own index (anything else).
        index_kind=kind,
        index_params=params,
        vector_storage=QDRANT,
        source=source.as_dict(),
        count=shape.count,
    )
    session.add(gallery)
    session.flush()
    points = [item.id for part in qdrant_storage(settings).scroll_ids(gallery) for item in part]
    qdrant_ids.record(session, gallery.id, points)
    gallery.count = len(points)
    return gallery


class CollectionChanged(ValueError):
    """The attached collection can no longer serve its gallery as recorded (gone, another
    dimension or metric): a job on it fails saying so, and nothing is written."""


def recheck(session: Session, settings: Settings, gallery: Gallery) -> dict[str, Any] | None:
    """Compare an attached collection with what its gallery recorded, at the start of each job
    on it (its owner changes it at any time). Another dimension, a metric other than Cosine or a
    missing collection or vector raise ``CollectionChanged``; another point count is taken as
    the gallery's (staged; the caller commits) and returned for the job's report:
    ``{"points_recorded", "points_now", "changed"}``. None for a gallery that is not attached.
    A collection out of reach raises the 503 ``Problem`` (the job fails, it may be retried)."""
    if gallery.vector_storage != QDRANT:
        return None
    try:
        shape = describe(settings, QdrantSource.of(gallery.source or {}))
    except Problem as exc:
        if exc.status >= 500:
            raise
        raise CollectionChanged(
            f"the attached collection changed under the service: {exc.detail}"
        ) from exc
    if shape.dim != gallery.dim:
        raise CollectionChanged(
            f"the attached collection changed under the service: its vectors have dimension "
            f"{shape.dim}, the gallery's {gallery.dim}; attach it again as a new gallery"
        )
    recorded = gallery.count
    gallery.count = shape.count
    return {
        "points_recorded": recorded,
        "points_now": shape.count,
        "changed": recorded != shape.count,
    }
