"""An attached Milvus collection behind the vector-storage interface, read-only, and its search —
the Milvus twin of ``app.vectors.qdrant.storage``.

The gallery's vectors are the collection's rows (``app.vectors.milvus.source`` says where);
the service never writes to the collection: ``upsert`` and ``delete`` refuse (the galleries
service refuses before them, with the same answer). Reads go to Milvus on every call, with
Strong consistency, so the API process holds nothing per gallery, and a row added or removed by
the collection's owner is seen at once. Item ids are the primary keys as strings (the INT64 key
in decimal, the VARCHAR key itself); internal ids come from ``app.vectors.attached_ids``, whose
mapping and table serve every attached engine.

Search (``MilvusAttachedSearcher``): an attached gallery is a cosine gallery, whose points all
lie at one radius, so the Lorentz ranking of a query point is the cosine ranking of its space
components against the stored vectors: Milvus's COSINE search of the vector field returns the
top k (exact when the owner indexed the field FLAT, the collection's own recall otherwise), and
the hits' vectors, lifted as the service lifts them, give the float64 distances (the numbers a
copied gallery's FAISS search gives). A transport failure answers 503 and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.errors import conflict
from app.core.settings import Settings
from app.vectors import attached_ids
from app.vectors.attached import AttachedSearcher, KeyedStorage
from app.vectors.engine import SCAN_BATCH, Stored, StoredGallery
from app.vectors.milvus.attach import AttachedCollection
from app.vectors.milvus.search import MAX_TOPK
from app.vectors.milvus.source import MilvusSource, connection, reachable, reader
from app.vectors.rerank import no_hits, ranked_hits

# Rows per query page, and queries per search request.
READ_BATCH = 1024
SEARCH_BATCH = 64
# Hits asked for past the k-th place (the search keeps the k nearest, ties by id).
TIE_ROOM = 16


def read_only(gallery_id: str) -> Exception:
    return conflict(
        f"gallery {gallery_id} is an attached Milvus collection: the service never writes to "
        "it; change its rows in Milvus itself"
    )


# The primary key an item id names (shared with the other attached engines).
point_of = attached_ids.key_of


class MilvusAttachedStorage(KeyedStorage[MilvusSource]):
    name = "milvus_attached"

    def source(self, gallery: StoredGallery) -> MilvusSource:
        return MilvusSource.of(gallery.source or {})

    def refusal(self, gallery_id: str) -> Exception:
        return read_only(gallery_id)

    def collection(self, gallery: StoredGallery) -> tuple[MilvusSource, Any, AttachedCollection]:
        """(source, its connection, a reader of the gallery's collection)."""
        source = self.source(gallery)
        conn = connection(self.settings, source)
        return source, conn, reader(conn, source, gallery.dim)

    def lookup(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        source, conn, rows = self.collection(gallery)
        with reachable(source), conn.use():
            found = rows.existing(self._keys(gallery, item_ids))
        return {
            attached_ids.item_id(key): (attached_ids.internal_of(key), None)
            for key in sorted(found)
        }

    def fetch(self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]) -> Stored:
        source, conn, rows = self.collection(gallery)
        with reachable(source), conn.use():
            keys, vectors = rows.fetch_vectors(self._keys(gallery, item_ids))
        ids = np.array([attached_ids.internal_of(k) for k in keys], dtype=np.int64)
        items = [attached_ids.item_id(k) for k in keys]
        n = len(items)
        return Stored(items, ids, vectors, [None] * n, [None] * n)

    def _pages(
        self, gallery: StoredGallery, vectors: bool, batch: int, only: str = ""
    ) -> Iterator[list[dict]]:
        source, conn, rows = self.collection(gallery)
        pages = rows.iterate(batch, vectors, only)
        while True:
            with reachable(source), conn.use():
                page = next(pages, None)
            if page is None:
                return
            attached_ids.remember(gallery.id, [row[source.id_field] for row in page])
            yield page

    def scan(
        self, session: Session, gallery: StoredGallery, batch: int = SCAN_BATCH
    ) -> Iterator[Stored]:
        """Every row, in batches, each ascending by internal id."""
        source = self.source(gallery)
        for page in self._pages(gallery, vectors=True, batch=min(batch, READ_BATCH)):
            keys = [row[source.id_field] for row in page]
            ids = np.array([attached_ids.internal_of(k) for k in keys], dtype=np.int64)
            order = np.argsort(ids, kind="stable")
            vectors = np.asarray([page[i][source.vector_field] for i in order.tolist()], np.float32)
            items = [attached_ids.item_id(keys[i]) for i in order.tolist()]
            n = len(items)
            yield Stored(items, ids[order], vectors.reshape(n, gallery.dim), [None] * n, [None] * n)

    def scroll_keys(self, gallery: StoredGallery) -> Iterator[list[int | str]]:
        """Every primary key, in pages."""
        source = self.source(gallery)
        for page in self._pages(gallery, vectors=False, batch=10 * READ_BATCH):
            yield [row[source.id_field] for row in page]

    def mapped_keys(self, gallery: StoredGallery) -> Iterator[list[int | str]]:
        """The primary keys that are not their own internal id, in pages (the attach records
        them, ``attached_ids.record``): every VARCHAR key, and of INT64 keys only those outside
        [0, 2⁶²), found by a filter rather than by reading every key (a million-row collection
        is paged through in minutes by milvus-lite)."""
        source = self.source(gallery)
        field = source.id_field
        only = "" if source.string_ids else f"{field} < 0 or {field} >= {attached_ids.PLAIN_LIMIT}"
        for page in self._pages(gallery, vectors=False, batch=10 * READ_BATCH, only=only):
            yield [row[field] for row in page]

    def all_ids(self, session: Session, gallery: StoredGallery) -> np.ndarray:
        parts = [np.zeros(0, dtype=np.int64)]
        for keys in self.scroll_keys(gallery):
            parts.append(np.array([attached_ids.internal_of(k) for k in keys], np.int64))
        return np.sort(np.concatenate(parts))

    def points(self, gallery: StoredGallery) -> int:
        """Rows in the collection now."""
        source, conn, rows = self.collection(gallery)
        with reachable(source), conn.use():
            return rows.count()


class MilvusAttachedSearcher(AttachedSearcher[MilvusAttachedStorage]):
    """The attached Milvus collection behind the two index calls the search services make."""

    def search_with_points(
        self,
        queries: np.ndarray,
        k: int,
        *,
        overfetch: int = 4,
        min_candidates: int = 64,
        without: Sequence[int | str] = (),
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(internal ids, float64 distances, float32 points) per query, nearest first, −1 / inf
        / NaN padded, as ``LorentzIndex.search_with_points``. The candidate sizes of the FAISS
        path do not apply: Milvus's cosine top k is the answer. ``without``: primary keys left
        out by the search's filter (a mixed search's old list leaves the re-embedded rows to
        their own collection's search)."""
        gallery = self._gallery
        source, conn, rows = self._storage.collection(gallery)
        queries = np.asarray(queries, dtype=np.float64).reshape(-1, self.dim)
        ids, distances, points = no_hits(len(queries), k, self.dim)
        expr = rows.ids_filter(list(without), negate=True) if len(without) else ""
        # Past the k-th place: a tie across it (duplicate documents) is then ordered by id
        # whole, as every engine orders ties (``lorentz_rows.nearest_first``).
        limit = min(k + TIE_ROOM, MAX_TOPK)
        for start in range(0, len(queries), SEARCH_BATCH):
            part = queries[start : start + SEARCH_BATCH]
            with reachable(source), conn.use():
                answers = rows.search_rows(part, limit, expr)
            for offset, hits in enumerate(answers):
                row = start + offset
                if not hits:
                    continue
                keys = [key for key, _ in hits]
                attached_ids.remember(gallery.id, keys)
                hit_ids = np.array([attached_ids.internal_of(key) for key in keys], dtype=np.int64)
                vectors = np.stack([vector for _, vector in hits])
                at, dist, found = ranked_hits(
                    part[offset], vectors, gallery.lift_scale, gallery.lift_curv, k, ids=hit_ids
                )
                n = len(at)
                ids[row, :n] = hit_ids[at]
                distances[row, :n], points[row, :n] = dist, found
        return ids, distances, points


def milvus_attached_storage(settings: Settings) -> MilvusAttachedStorage:
    return MilvusAttachedStorage(settings)
