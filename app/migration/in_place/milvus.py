"""Partial backfill of an attached Milvus collection, in place (issue 27, item 2, Milvus).

Re-embedded items are written beside the user's collection, in a sibling collection of the same
deployment keyed by the same primary keys (``app.vectors.milvus.sibling`` says why not a vector
field of the same rows), not into the service's store: the service keeps one row per item
(``ReembeddedVector`` with ``features`` NULL) so that the plan, progress and deletes count them
as they count any gallery's (``rows.store_written``). Mixed and transition searches run one
Milvus search per collection (``search_lists``) and go through the same merge as every other
gallery (``app.migration.mixed_search``).

Order of writes: the sibling first, then the rows, committed before the upload is acknowledged,
as for Qdrant. A row the owner deleted after the plan listed it is skipped and reported; one
deleted between the service's look-up and its write is found by a second look-up after the
write, its sibling row removed again, and skipped too (Qdrant refuses such a write itself;
Milvus's upsert into the sibling cannot know).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.db import utcnow
from app.core.errors import conflict
from app.core.settings import Settings
from app.galleries.models import Gallery
from app.migration.in_place.rows import refuse_unnamed, store_written
from app.migration.mixed_search import Lists
from app.migration.reembed import reembedded_count
from app.models.models import TrainedModel
from app.vectors.faiss.index_store import IndexStore
from app.vectors.milvus import sibling as milvus_sibling
from app.vectors.milvus import texts as milvus_texts
from app.vectors.milvus.attached import (
    MilvusAttachedSearcher,
    MilvusAttachedStorage,
    milvus_attached_storage,
    point_of,
)
from app.vectors.milvus.source import MilvusSource
from app.vectors.storage import session_settings


def _place(session: Session, gallery: Gallery, model_id: str) -> tuple[MilvusAttachedStorage, str]:
    storage = milvus_attached_storage(session_settings(session))
    name = milvus_sibling.migration_collection(storage.source(gallery).collection, model_id)
    return storage, name


def store_in_place(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    upload: tuple[list[str], np.ndarray],
) -> dict[str, Any]:
    """Write an upload (ids and features) into the model's sibling collection, and count them.
    Ids that cannot name a row answer 422 (nothing written); rows no longer in the collection
    are skipped and listed under ``skipped``."""
    ids, matrix = upload
    storage, name = _place(session, gallery, row.id)
    string_ids = storage.source(gallery).string_ids
    refuse_unnamed(ids, lambda item: point_of(item, string_ids), "an INT64 key in decimal")
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
    storage: MilvusAttachedStorage,
    gallery: Gallery,
    name: str,
    model_id: str,
    ids: list[str],
    matrix: np.ndarray,
) -> dict[int, int]:
    """Position in ``ids`` → internal id, of the items written: those whose row exists before
    and after the write."""
    string_ids = storage.source(gallery).string_ids
    present = storage.lookup(session, gallery, ids)
    kept = [n for n, item in enumerate(ids) if item in present]
    if not kept:
        return {}
    milvus_sibling.ensure_collection(storage, gallery, name, matrix.shape[1])
    keys = [point_of(ids[n], string_ids) for n in kept]
    milvus_sibling.write(storage, gallery, name, model_id, keys, matrix[kept], utcnow().isoformat())
    after = storage.lookup(session, gallery, [ids[n] for n in kept])
    gone = [key for n, key in zip(kept, keys, strict=True) if ids[n] not in after]
    if gone:
        milvus_sibling.remove(storage, gallery, name, gone)
    return {n: present[ids[n]][0] for n in kept if ids[n] in after}


def search_lists(
    session: Session,
    gallery: Gallery,
    row: TrainedModel,
    features: np.ndarray,
    query_points: np.ndarray,
    k: int,
) -> Lists | None:
    """The two lists of a mixed search of an attached Milvus collection: the native one searched
    in the model's sibling collection, the other in the owner's collection among the rows the
    sibling does not hold. None when no item is re-embedded for the model. 409 when the rows
    count re-embedded items but the sibling collection is gone (dropped by someone): the old
    vectors alone would answer for items meant to be scored in the new space, unmerged."""
    if reembedded_count(session, gallery.id, row.id) == 0:
        return None
    storage, name = _place(session, gallery, row.id)
    if milvus_sibling.shape(storage, gallery, name) is None:
        raise conflict(
            f"gallery {gallery.id} counts items re-embedded for model {row.id}, but their "
            f"collection {name!r} no longer exists: searching would mix the spaces without "
            "the merge. Upload the re-embedded items again, or delete the model (cascade) to "
            "search the old vectors alone"
        )
    native = milvus_sibling.search_vector(storage, gallery, name, features, k)
    held = milvus_sibling.keys(storage, gallery, name)
    ids, dist, _ = MilvusAttachedSearcher(storage, gallery).search_with_points(
        query_points, k, without=held
    )
    return native, (ids, dist)


def forget(settings: Settings, gallery: Gallery, model_ids: list[str]) -> None:
    """Drop the models' sibling collections beside the gallery's collection
    (``milvus_sibling.forget_models``; best effort)."""
    source = MilvusSource.of(gallery.source or {})
    milvus_sibling.forget_models(settings, gallery.id, source, model_ids)


def read_texts(
    settings: Settings, gallery: Gallery, field: str, items: list[str]
) -> dict[str, str]:
    """Item id → document text, of the items whose row holds one in ``field``."""
    return milvus_texts.read_texts(milvus_attached_storage(settings), gallery, field, items)


def read_vectors(
    settings: Settings, gallery: Gallery, model_id: str, items: list[str]
) -> tuple[list[str], np.ndarray]:
    """(item ids, rows) the model's sibling collection holds for the items."""
    storage = milvus_attached_storage(settings)
    name = milvus_sibling.migration_collection(storage.source(gallery).collection, model_id)
    return milvus_texts.read_vectors(storage, gallery, name, items)
