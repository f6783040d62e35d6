"""Partial backfill of an attached collection, in place (issue 27, item 2): the re-embedded items'
vectors written into the owner's deployment, beside the old ones, counted by the service's rows.

One module per engine — ``qdrant`` (a named vector of the user's own points), ``milvus`` (a
sibling collection keyed by the same primary keys), ``pgvector`` (a ``vector(D)`` column per model
added to the owner's table) — over what they share (``rows``: the ids
refused, the counting under the upload's locks); ``texts`` reads the items' document texts for a
two-stage search or a re-embed job through ``read_texts`` and ``read_vectors`` here. This module
is the one that picks the engine, by the gallery's ``vector_storage``, as ``app.vectors.storage``
does for storages; the engine modules never import each other ([tool.importlinter] in
pyproject.toml). pymilvus is an optional dependency: the Milvus module loads only when a Milvus
gallery needs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.settings import Settings
from app.galleries.models import Gallery
from app.migration.in_place import pgvector, qdrant
from app.migration.mixed_search import Lists
from app.models.models import TrainedModel
from app.vectors.engine import ATTACHED_MILVUS, ATTACHED_PGVECTOR, QDRANT
from app.vectors.faiss.index_store import IndexStore
from app.vectors.storage import session_settings


def store_in_place(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    upload: tuple[list[str], np.ndarray],
) -> dict[str, Any]:
    """Write an upload (ids and features, as ``reembed.checked_features`` returns them) into the
    attached collection as the model's vectors (Qdrant: a named vector of those points, Milvus:
    a sibling collection, pgvector: a column of the table), and count them. Ids that cannot name
    a point answer 422 (nothing written); points no longer in the collection are skipped and
    listed under ``skipped``."""
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        return pgvector.store_in_place(session, store, gallery, row, upload)
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.migration.in_place import milvus

        return milvus.store_in_place(session, store, gallery, row, upload)
    return qdrant.store_in_place(session, store, gallery, row, upload)


def search_lists(
    session: Session,
    gallery: Gallery,
    row: TrainedModel,
    features: np.ndarray,
    query_points: np.ndarray,
    k: int,
) -> Lists | None:
    """The two lists of a mixed search of an attached collection (``mixed_search.SearchLists``):
    the native one searched by the model's vectors in the collection, the other by the old
    vectors of the points without them; None when no item is re-embedded for the model (each
    engine's ``search_lists`` says when it answers 409)."""
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.migration.in_place import milvus

        return milvus.search_lists(session, gallery, row, features, query_points, k)
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        return pgvector.search_lists(session, gallery, row, features, query_points, k)
    return qdrant.search_lists(session, gallery, row, features, query_points, k)


def forget_model(session: Session, gallery_ids: Iterable[str], model_id: str) -> None:
    """After a model's re-embedded items were deleted (committed): take what the service wrote
    for it out of the attached collections among ``gallery_ids`` (Qdrant: its named vector and
    provenance; Milvus: its sibling collection; pgvector: its column). Best effort: what stays, no search reads any
    more."""
    settings = session_settings(session)
    for gallery_id in gallery_ids:
        gallery = session.get(Gallery, gallery_id)
        if gallery is None:
            continue
        if gallery.vector_storage == QDRANT:
            qdrant.forget(settings, gallery, [model_id])
        elif gallery.vector_storage == ATTACHED_MILVUS:
            from app.migration.in_place import milvus

            milvus.forget(settings, gallery, [model_id])
        elif gallery.vector_storage == ATTACHED_PGVECTOR:
            pgvector.forget(settings, gallery, [model_id])


def read_texts(
    settings: Settings, gallery: Gallery, field: str, items: list[str]
) -> dict[str, str]:
    """Item id → document text, of the items of an attached collection whose point or row holds
    one in ``field`` (``texts.texts_of``)."""
    if gallery.vector_storage == QDRANT:
        return qdrant.read_texts(settings, gallery, field, items)
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        return pgvector.read_texts(settings, gallery, field, items)
    from app.migration.in_place import milvus

    return milvus.read_texts(settings, gallery, field, items)


def read_vectors(
    settings: Settings, gallery: Gallery, model_id: str, items: list[str]
) -> tuple[list[str], np.ndarray]:
    """(item ids, rows) of the model's vectors the attached collection holds for the items:
    Qdrant's named vector, Milvus's sibling rows, pgvector's column
    (``texts.in_place_vectors``)."""
    if gallery.vector_storage == QDRANT:
        return qdrant.read_vectors(settings, gallery, model_id, items)
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        return pgvector.read_vectors(settings, gallery, model_id, items)
    from app.migration.in_place import milvus

    return milvus.read_vectors(settings, gallery, model_id, items)
