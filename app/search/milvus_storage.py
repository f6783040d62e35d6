"""The Milvus engine behind the vector-storage interface (``app.vectors.engine.VectorStorage``).

Not selected by ``storage_for`` yet: wiring ``NOBACKFILL_VECTOR_ENGINE=milvus`` end to end (the
setting, ``storage_for``, and searches answered by Milvus instead of the in-process FAISS index)
is a later step. This adapter is what that step plugs in.

One difference from the interface's contract, by construction: a write reaches Milvus when the
call returns, not when the caller's SQL transaction commits; a rollback does not undo it. What
keeps the two stores consistent instead: the caller holds the gallery row's lock across the call
and its commit (so writers of one gallery are serialised, which the id reservation needs too);
an upsert or delete is idempotent, so a request retried after a failed commit converges; and the
counts the service reports come from Milvus (``count``), not from a column a rollback would keep.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.galleries.models import Gallery
from app.galleries.service import lifted_points
from app.search.milvus_engine import GalleryLayout, MilvusEngine, MilvusGallery, StoredRows
from app.search.milvus_math import choose_layout
from app.vectors.engine import SCAN_BATCH, Stored, Upserted

COLLECTION_PREFIX = "nobackfill_"


def collection_name(gallery_id: str) -> str:
    return f"{COLLECTION_PREFIX}{gallery_id}"


def layout_of(gallery: Gallery) -> GalleryLayout:
    """External cosine galleries lie at one radius (the cosine layout, searching the stored
    vectors); model-bound and dot galleries do not (tangent). A flat gallery asks for exact
    search (FLAT)."""
    one_radius = gallery.bound_model_id is None and gallery.metric == "cosine"
    layout, index_type = choose_layout(one_radius, exact=gallery.index_kind == "flat")
    return GalleryLayout(
        collection_name(gallery.id),
        gallery.dim,
        gallery.dim,
        gallery.lift_curv,
        layout,
        index_type,
        # The points of a cosine gallery follow from its stored vectors: one vector per row.
        lift_scale=gallery.lift_scale if one_radius else None,
    )


def _stored(rows: StoredRows) -> Stored:
    return Stored(rows.item_ids, rows.row_ids, rows.vectors, rows.labels, rows.metadata)


class MilvusVectorStorage:
    """Gallery vectors in one Milvus collection per gallery (created on first use)."""

    name = "milvus"

    def __init__(self, engine: MilvusEngine) -> None:
        self.engine = engine

    def gallery(self, gallery: Gallery) -> MilvusGallery:
        name = collection_name(gallery.id)
        if self.engine.has_gallery(name):
            return self.engine.open_gallery(name)
        return self.engine.create_gallery(layout_of(gallery))

    def upsert(
        self,
        session: Session,
        gallery: Gallery,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        metadata: Sequence[dict[str, Any] | None],
    ) -> Upserted:
        store = self.gallery(gallery)
        before = store.lookup(item_ids)
        vectors = np.asarray(vectors, dtype=np.float32)
        points = None if store.layout.lift_scale is not None else lifted_points(gallery, vectors)
        ids = store.upsert(item_ids, vectors, points, labels, metadata)
        replaced = np.array([row_id for row_id, _ in before.values()], dtype=np.int64)
        return Upserted(ids=ids, replaced=np.sort(replaced), inserted=len(ids) - len(before))

    def delete(self, session: Session, gallery: Gallery, item_ids: Sequence[str]) -> np.ndarray:
        store = self.gallery(gallery)
        present = store.lookup(item_ids)
        store.delete(list(present))
        return np.sort(np.array([row_id for row_id, _ in present.values()], dtype=np.int64))

    def lookup(
        self, session: Session, gallery: Gallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        return self.gallery(gallery).lookup(item_ids)

    def fetch(self, session: Session, gallery: Gallery, item_ids: Sequence[str]) -> Stored:
        return _stored(self.gallery(gallery).fetch(item_ids))

    def names(
        self, session: Session, gallery: Gallery, ids: Sequence[int]
    ) -> dict[int, tuple[str, str | None]]:
        return self.gallery(gallery).names(ids)

    def scan(self, session: Session, gallery: Gallery, batch: int = SCAN_BATCH) -> Iterator[Stored]:
        for rows in self.gallery(gallery).scan(batch):
            yield _stored(rows)

    def all_ids(self, session: Session, gallery: Gallery) -> np.ndarray:
        return self.gallery(gallery).all_row_ids()

    def count(self, session: Session, gallery: Gallery) -> int:
        return self.gallery(gallery).count()

    def drop(self, gallery_id: str) -> None:
        self.engine.drop_gallery(collection_name(gallery_id))
