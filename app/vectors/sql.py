"""Vectors as SQL rows (``gallery_vectors``, one row per item; its primary key is the internal
id). The storage of every gallery before segment files existed, and still read for them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from app.core.db import utcnow
from app.vectors.engine import SCAN_BATCH, Stored, StoredGallery, Upserted
from app.vectors.tables import GalleryVector

# Bound on the number of SQL parameters in one IN (…) list (SQLite's limit is far above this).
IN_CHUNK = 500


def _chunks(values: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), IN_CHUNK):
        yield values[start : start + IN_CHUNK]


def _matrix(blobs: list[bytes], dim: int) -> np.ndarray:
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dim).astype(np.float32)


class SqlVectorStorage:
    name = "sql"

    def lookup(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        found: dict[str, tuple[int, str | None]] = {}
        for chunk in _chunks(item_ids):
            found.update(
                (item_id, (row_id, label))
                for row_id, item_id, label in session.execute(
                    select(GalleryVector.id, GalleryVector.item_id, GalleryVector.label).where(
                        GalleryVector.gallery_id == gallery.id, GalleryVector.item_id.in_(chunk)
                    )
                )
            )
        return found

    def upsert(
        self,
        session: Session,
        gallery: StoredGallery,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        metadata: Sequence[dict[str, Any] | None],
    ) -> Upserted:
        existing = {i: row_id for i, (row_id, _) in self.lookup(session, gallery, item_ids).items()}
        blobs = [np.ascontiguousarray(row, dtype="<f4").tobytes() for row in vectors]
        now = utcnow()
        rows = list(zip(item_ids, blobs, labels, metadata, strict=True))
        updates = [
            {"id": existing[i], "vector": b, "label": lab, "item_metadata": m, "updated_at": now}
            for i, b, lab, m in rows
            if i in existing
        ]
        inserts = [
            {
                "gallery_id": gallery.id,
                "item_id": i,
                "vector": b,
                "label": lab,
                "item_metadata": m,
                "updated_at": now,
            }
            for i, b, lab, m in rows
            if i not in existing
        ]
        if updates:
            session.execute(update(GalleryVector), updates)
        row_ids = dict(existing)
        if inserts:
            returned = session.execute(
                insert(GalleryVector).returning(GalleryVector.id, GalleryVector.item_id), inserts
            )
            row_ids.update((item_id, row_id) for row_id, item_id in returned)
        return Upserted(
            ids=np.array([row_ids[i] for i in item_ids], dtype=np.int64),
            replaced=np.array([u["id"] for u in updates], dtype=np.int64),
            inserted=len(inserts),
        )

    def delete(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> np.ndarray:
        row_ids = [row_id for row_id, _ in self.lookup(session, gallery, item_ids).values()]
        for chunk in _chunks(row_ids):
            session.execute(delete(GalleryVector).where(GalleryVector.id.in_(chunk)))
        return np.array(row_ids, dtype=np.int64)

    def fetch(self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]) -> Stored:
        found: dict[str, tuple[int, bytes, str | None, dict[str, Any] | None]] = {}
        for chunk in _chunks(item_ids):
            rows = session.execute(
                select(
                    GalleryVector.item_id,
                    GalleryVector.id,
                    GalleryVector.vector,
                    GalleryVector.label,
                    GalleryVector.item_metadata,
                ).where(GalleryVector.gallery_id == gallery.id, GalleryVector.item_id.in_(chunk))
            )
            found.update((item_id, (i, v, lab, m)) for item_id, i, v, lab, m in rows)
        present = [i for i in item_ids if i in found]
        return Stored(
            item_ids=present,
            ids=np.array([found[i][0] for i in present], dtype=np.int64),
            vectors=_matrix([found[i][1] for i in present], gallery.dim),
            labels=[found[i][2] for i in present],
            metadata=[found[i][3] for i in present],
        )

    def names(
        self, session: Session, gallery: StoredGallery, ids: Sequence[int]
    ) -> dict[int, tuple[str, str | None]]:
        items: dict[int, tuple[str, str | None]] = {}
        for chunk in _chunks(list(ids)):
            rows = session.execute(
                select(GalleryVector.id, GalleryVector.item_id, GalleryVector.label).where(
                    GalleryVector.gallery_id == gallery.id, GalleryVector.id.in_(chunk)
                )
            )
            items.update((row_id, (item_id, label)) for row_id, item_id, label in rows)
        return items

    def scan(
        self, session: Session, gallery: StoredGallery, batch: int = SCAN_BATCH
    ) -> Iterator[Stored]:
        rows = session.execute(
            select(
                GalleryVector.id,
                GalleryVector.item_id,
                GalleryVector.vector,
                GalleryVector.label,
                GalleryVector.item_metadata,
            )
            .where(GalleryVector.gallery_id == gallery.id)
            .order_by(GalleryVector.id)
            .execution_options(yield_per=batch)
        )
        for part in rows.partitions(batch):
            yield Stored(
                item_ids=[r.item_id for r in part],
                ids=np.array([r.id for r in part], dtype=np.int64),
                vectors=_matrix([r.vector for r in part], gallery.dim),
                labels=[r.label for r in part],
                metadata=[r.item_metadata for r in part],
            )

    def all_ids(self, session: Session, gallery: StoredGallery) -> np.ndarray:
        return np.fromiter(
            session.scalars(
                select(GalleryVector.id)
                .where(GalleryVector.gallery_id == gallery.id)
                .order_by(GalleryVector.id)
            ),
            dtype=np.int64,
        )

    def count(self, session: Session, gallery: StoredGallery) -> int:
        return int(
            session.scalar(select(func.count()).where(GalleryVector.gallery_id == gallery.id)) or 0
        )

    def drop(self, gallery_id: str) -> None:
        """Nothing outside the database: the gallery's cascade deleted its rows."""
