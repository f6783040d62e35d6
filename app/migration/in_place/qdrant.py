"""Partial backfill of an attached Qdrant collection, in place (issue 27, item 2); an attached
Milvus collection's is ``app.migration.in_place.milvus``, which shares the counting
(``rows.store_written``) and the merge; ``app.migration.in_place`` picks one by the gallery.

Re-embedded items are written into the user's collection as a named vector of their own points
(``app.vectors.qdrant.named``), not into the service's store: the service keeps one row per item
(``ReembeddedVector`` with ``features`` NULL) so that the plan, progress and deletes count them as
they count any gallery's. Mixed and transition searches run one Qdrant search per vector
(``search_lists``) and go through the same merge as every other gallery
(``app.migration.mixed_search``).

Order of writes: the collection first, then the rows, committed before the upload is
acknowledged. A failure in between leaves vectors in the collection that no row counts yet: a
search still merges them correctly (its lists are split by the collection's own vectors, not by
the rows) and the progress under-counts until the upload is retried, which rewrites the same
vectors. A point deleted in the collection after the plan listed it is skipped and reported, not
an error: the owner may delete points at any time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.db import utcnow
from app.core.errors import Problem, conflict
from app.core.settings import Settings
from app.galleries.models import Gallery
from app.migration.in_place.rows import refuse_unnamed, store_written
from app.migration.mixed_search import Lists
from app.migration.reembed import reembedded_count
from app.models.models import TrainedModel
from app.vectors import attached_ids
from app.vectors.faiss.index_store import IndexStore
from app.vectors.qdrant import named as qdrant_named
from app.vectors.qdrant import texts as qdrant_texts
from app.vectors.qdrant.source import QdrantSource
from app.vectors.qdrant.storage import QdrantSearcher, QdrantVectorStorage, qdrant_storage
from app.vectors.storage import session_settings


def store_in_place(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    upload: tuple[list[str], np.ndarray],
) -> dict[str, Any]:
    """Write an upload (ids and features, as ``reembed.checked_features`` returns them) as the
    model's named vector of those points, and count
    them. Ids that cannot name a point answer 422 (nothing written); points no longer in the
    collection are skipped and listed under ``skipped``."""
    ids, matrix = upload
    refuse_unnamed(ids, attached_ids.point_of, "an integer or a UUID")
    storage = qdrant_storage(session_settings(session))
    name = qdrant_named.migration_vector(row.id)
    return store_written(
        session,
        store,
        gallery,
        row,
        ids,
        lambda locked: _write_present(session, storage, locked, name, row.id, ids, matrix),
    )


def _write_present(
    session: Session,
    storage: QdrantVectorStorage,
    gallery: Gallery,
    name: str,
    model_id: str,
    ids: list[str],
    matrix: np.ndarray,
) -> dict[int, int]:
    """Position in ``ids`` → internal id, of the items written: those whose point exists. A
    point deleted between the look-up and the write fails the write (Qdrant answers "not
    found"): looked up again and written without it, once."""
    written_at = utcnow().isoformat()
    for attempt in range(2):
        present = storage.lookup(session, gallery, ids)
        kept = [n for n, item in enumerate(ids) if item in present]
        if not kept:
            return {}
        qdrant_named.ensure_vector(storage, gallery, name, matrix.shape[1])
        try:
            qdrant_named.write(
                storage,
                gallery,
                name,
                model_id,
                [attached_ids.point_of(ids[n]) for n in kept],
                matrix[kept],
                written_at,
            )
            return {n: present[ids[n]][0] for n in kept}
        except Problem:
            raise
        except Exception:
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def search_lists(
    session: Session,
    gallery: Gallery,
    row: TrainedModel,
    features: np.ndarray,
    query_points: np.ndarray,
    k: int,
) -> Lists | None:
    """The two lists of a mixed search of an attached collection (``mixed_search.SearchLists``):
    the native one searched by the model's named vector, the other by the old vector of the
    points without it; Qdrant's top k is exact, so no candidate sizes apply. None when no item
    is re-embedded for the model. 409 when the rows count re-embedded items but the collection
    lost their vector (its owner dropped it): the old vector alone would answer for items meant
    to be scored in the new space, unmerged."""
    if reembedded_count(session, gallery.id, row.id) == 0:
        return None
    storage = qdrant_storage(session_settings(session))
    name = qdrant_named.migration_vector(row.id)
    if qdrant_named.vector_params(storage, gallery, name) is None:
        raise conflict(
            f"gallery {gallery.id} counts items re-embedded for model {row.id}, but its "
            f"collection no longer has their vector {name!r}: searching it would mix the "
            "spaces without the merge. Upload the re-embedded items again, or delete the model "
            "(cascade) to search the old vectors alone"
        )
    native = qdrant_named.search_vector(storage, gallery, name, features, k)
    ids, dist, _ = QdrantSearcher(storage, gallery).search_with_points(
        query_points, k, without=name
    )
    return native, (ids, dist)


def forget(settings: Settings, gallery: Gallery, model_ids: list[str]) -> None:
    """Take the models' named vectors and provenance out of the gallery's collection
    (``qdrant_named.forget_models``; best effort)."""
    source = QdrantSource.of(gallery.source or {})
    qdrant_named.forget_models(settings, gallery.id, source, model_ids)


def read_texts(
    settings: Settings, gallery: Gallery, field: str, items: list[str]
) -> dict[str, str]:
    """Item id → document text, of the items whose point holds one in ``field``."""
    return qdrant_texts.read_texts(qdrant_storage(settings), gallery, field, items)


def read_vectors(
    settings: Settings, gallery: Gallery, model_id: str, items: list[str]
) -> tuple[list[str], np.ndarray]:
    """(item ids, rows) of the model's named vector the items' points hold (none when the
    collection has no such vector)."""
    storage = qdrant_storage(settings)
    name = qdrant_named.migration_vector(model_id)
    if qdrant_named.vector_params(storage, gallery, name) is None:
        return [], np.zeros((0, 0), dtype=np.float32)
    return qdrant_texts.read_vectors(storage, gallery, name, items)
