"""Partial backfill of an attached Qdrant collection, in place (issue 27, item 2); an attached
Milvus collection's goes through ``app.migration.in_place_milvus``, which shares the counting
(``store_written``) and the merge.

Re-embedded items are written into the user's collection as a named vector of their own points
(``app.vectors.qdrant_named``), not into the service's store: the service keeps one row per item
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

from collections.abc import Iterable
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.db import utcnow
from app.core.errors import Problem, conflict
from app.galleries.models import Gallery
from app.migration.in_place_rows import refuse_unnamed, store_written
from app.migration.mixed_search import Lists
from app.migration.reembed import reembedded_count
from app.models.models import TrainedModel
from app.vectors import qdrant_ids, qdrant_named
from app.vectors.engine import ATTACHED_MILVUS, ATTACHED_PGVECTOR, QDRANT
from app.vectors.index_store import IndexStore
from app.vectors.qdrant_source import QdrantSource
from app.vectors.qdrant_storage import QdrantSearcher, QdrantVectorStorage, qdrant_storage
from app.vectors.storage import session_settings


def refuse_pgvector(gallery: Gallery, what: str) -> None:
    """409 for ``what`` on an attached pgvector table: the service writes nothing into it yet
    (an in-place migration's ``vector(D)`` column per model is not built), so neither
    re-embedded items nor the searches that embed texts into them have a place."""
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        raise conflict(
            f"{what} stores re-embedded vectors in the attached collection, and gallery "
            f"{gallery.id} is a pgvector table, which has no in-place migration yet: search it "
            "old→old or through a trained model's bridge (a transition search)"
        )


def store_in_place(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    upload: tuple[list[str], np.ndarray],
) -> dict[str, Any]:
    """Write an upload (ids and features, as ``reembed.checked_features`` returns them) as the
    model's named vector of those points (a Milvus collection: ``in_place_milvus``), and count
    them. Ids that cannot name a point answer 422 (nothing written); points no longer in the
    collection are skipped and listed under ``skipped``."""
    refuse_pgvector(gallery, "an upload of re-embedded items")
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.migration import in_place_milvus

        return in_place_milvus.store_in_place(session, store, gallery, row, upload)
    ids, matrix = upload
    refuse_unnamed(ids, qdrant_ids.point_of, "an integer or a UUID")
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
                [qdrant_ids.point_of(ids[n]) for n in kept],
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
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.migration import in_place_milvus

        return in_place_milvus.search_lists(session, gallery, row, features, query_points, k)
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        return None  # nothing re-embedded in place (``refuse_pgvector``): the old list alone
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


def forget_model(session: Session, gallery_ids: Iterable[str], model_id: str) -> None:
    """After a model's re-embedded items were deleted (committed): take what the service wrote
    for it out of the attached collections among ``gallery_ids`` (Qdrant: its named vector and
    provenance, ``qdrant_named.forget_models``; Milvus: its sibling collection,
    ``milvus_sibling.forget_models``). Best effort: what stays, no search reads any more."""
    settings = session_settings(session)
    for gallery_id in gallery_ids:
        gallery = session.get(Gallery, gallery_id)
        if gallery is None:
            continue
        if gallery.vector_storage == QDRANT:
            source = QdrantSource.of(gallery.source or {})
            qdrant_named.forget_models(settings, gallery.id, source, [model_id])
        elif gallery.vector_storage == ATTACHED_MILVUS:
            from app.vectors import milvus_sibling
            from app.vectors.milvus_source import MilvusSource

            source = MilvusSource.of(gallery.source or {})
            milvus_sibling.forget_models(settings, gallery.id, source, [model_id])
