"""An attached Qdrant collection behind the vector-storage interface, read-only, and its search.

The gallery's vectors are the collection's points (``app.vectors.qdrant.source`` says where);
the service never writes to the collection: ``upsert`` and ``delete`` refuse (the galleries
service refuses before them, with the same answer). Reads go to Qdrant on every call, so the
API process holds nothing per gallery, and a point added or removed by the collection's owner
is seen at once. Item ids and internal ids: ``app.vectors.attached_ids``.

Search (``QdrantSearcher``): an attached gallery is a cosine gallery, whose points all lie at one
radius r, so the Lorentz ranking of any query point q is the cosine ranking of q's space
components against the stored vectors (``app.vectors.milvus.layouts``, layout ``cosine``): Qdrant's
own Cosine search returns the exact top k, and the hits' vectors, lifted as the service lifts
them, give the float64 distances (the same numbers a copied gallery's FAISS search gives). A
transport failure answers 503 and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from qdrant_client import models
from sqlalchemy.orm import Session

from app.core.errors import conflict
from app.core.settings import Settings
from app.vectors import attached_ids
from app.vectors.attached import AttachedSearcher, ReadOnlyStorage
from app.vectors.engine import SCAN_BATCH, Stored, StoredGallery
from app.vectors.qdrant.source import Connection, QdrantSource, connection, reachable
from app.vectors.rerank import no_hits, ranked_hits

# Points per retrieve or scroll request, and queries per batched search request.
READ_BATCH = 1024
SEARCH_BATCH = 64
# Qdrant scores in float32: two cosines this close may be equal (or ordered the other way) in
# the float64 re-rank, so they count as a tie at the k-th place.
TIE_SLACK = 1e-6


def cuts_a_tie(hits: Sequence[Any], k: int, limit: int) -> bool:
    """Whether a search asked for ``limit`` > k hits may have cut a tie running across the k-th
    place: it returned all it was asked for and the last scores like the k-th."""
    return len(hits) >= limit and hits[-1].score >= hits[k - 1].score - TIE_SLACK


def asker(
    source: QdrantSource,
    conn: Connection,
    request: Callable[[np.ndarray, int], models.QueryRequest],
    query: np.ndarray,
) -> Callable[[int], Sequence[Any]]:
    """``limit`` → the hits of ``query``'s search asked with that limit (for ``past_ties``)."""

    def ask(limit: int) -> Sequence[Any]:
        with reachable(source), conn.use() as client:
            answer = client.query_batch_points(source.collection, requests=[request(query, limit)])
        return answer[0].points

    return ask


def scroll(
    settings: Settings,
    source: QdrantSource,
    batch: int,
    *,
    vectors: bool | list[str] = False,
    payload: bool | list[str] = False,
    only: models.Filter | None = None,
) -> Iterator[list[Any]]:
    """The collection's points (those matching ``only``), a non-empty page at a time."""
    conn = connection(settings, source)
    offset = None
    while True:
        with reachable(source), conn.use() as client:
            records, offset = client.scroll(
                source.collection,
                scroll_filter=only,
                limit=batch,
                offset=offset,
                with_payload=payload,
                with_vectors=vectors,
            )
        if records:
            yield records
        if offset is None:
            return


def past_ties(ask: Callable[[int], Sequence[Any]], hits: Sequence[Any], k: int) -> Sequence[Any]:
    """``hits`` (a search asked for k + 1), or those of a wider search (``ask(limit)``) while a
    tie may run across the k-th place: duplicate documents embed to one vector, and Qdrant
    returns tied points in its own order, so without all of them the re-rank could not order
    them by id (``app.vectors.lorentz_rows.nearest_first``) as every other engine does."""
    limit = k + 1
    while cuts_a_tie(hits, k, limit):
        limit *= 2
        hits = ask(limit)
    return hits


def read_only(gallery_id: str) -> Exception:
    return conflict(
        f"gallery {gallery_id} is an attached Qdrant collection: the service never writes to "
        "it; change its points in Qdrant itself"
    )


class QdrantVectorStorage(ReadOnlyStorage[QdrantSource]):
    name = "qdrant"

    def source(self, gallery: StoredGallery) -> QdrantSource:
        return QdrantSource.of(gallery.source or {})

    def refusal(self, gallery_id: str) -> Exception:
        return read_only(gallery_id)

    def _vectors(self, gallery: StoredGallery, records: Sequence[Any]) -> np.ndarray:
        """The records' vectors (the source's named one, else the unnamed one), n × dim. A
        point of an unnamed collection comes back as a dict (``""`` and the others) once an
        in-place migration has given it a named vector too."""
        name = self.source(gallery).vector
        rows = [r.vector[name or ""] if isinstance(r.vector, dict) else r.vector for r in records]
        return np.asarray(rows, dtype=np.float32).reshape(len(rows), gallery.dim)

    def _with_vectors(self, gallery: StoredGallery) -> bool | list[str]:
        name = self.source(gallery).vector
        return [name] if name is not None else True

    def _retrieve(
        self, gallery: StoredGallery, item_ids: Sequence[str], vectors: bool
    ) -> dict[str, Any]:
        """item id → record, for the asked ids that name a point of the collection."""
        source = self.source(gallery)
        points = [(item, attached_ids.point_of(item)) for item in item_ids]
        wanted = [point for _, point in points if point is not None]
        found: dict[str, Any] = {}
        conn = connection(self.settings, source)
        for start in range(0, len(wanted), READ_BATCH):
            with reachable(source), conn.use() as client:
                records = client.retrieve(
                    source.collection,
                    wanted[start : start + READ_BATCH],
                    with_payload=False,
                    with_vectors=self._with_vectors(gallery) if vectors else False,
                )
            found.update({attached_ids.item_id(r.id): r for r in records})
        return found

    def lookup(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        found = self._retrieve(gallery, item_ids, vectors=False)
        return {item: (attached_ids.internal_of(found[item].id), None) for item in found}

    def fetch(self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]) -> Stored:
        found = self._retrieve(gallery, item_ids, vectors=True)
        present = [item for item in item_ids if item in found]
        records = [found[item] for item in present]
        ids = np.array([attached_ids.internal_of(r.id) for r in records], dtype=np.int64)
        n = len(present)
        return Stored(present, ids, self._vectors(gallery, records), [None] * n, [None] * n)

    def _scroll(self, gallery: StoredGallery, vectors: bool, batch: int) -> Iterator[list[Any]]:
        with_vectors = self._with_vectors(gallery) if vectors else False
        for records in scroll(self.settings, self.source(gallery), batch, vectors=with_vectors):
            attached_ids.remember(gallery.id, [r.id for r in records])
            yield records

    def scan(
        self, session: Session, gallery: StoredGallery, batch: int = SCAN_BATCH
    ) -> Iterator[Stored]:
        """Every point, in batches, each ascending by internal id (plain ids come in ascending
        order across batches; mapped ones follow Qdrant's order, not the hash's)."""
        for records in self._scroll(gallery, vectors=True, batch=min(batch, READ_BATCH)):
            ids = np.array([attached_ids.internal_of(r.id) for r in records], dtype=np.int64)
            order = np.argsort(ids, kind="stable")
            vectors = self._vectors(gallery, records)[order]
            items = [attached_ids.item_id(records[i].id) for i in order.tolist()]
            n = len(items)
            yield Stored(items, ids[order], vectors, [None] * n, [None] * n)

    def scroll_ids(self, gallery: StoredGallery) -> Iterator[list[Any]]:
        """Every point without its vector, in pages (the attach maps their ids)."""
        return self._scroll(gallery, vectors=False, batch=10 * READ_BATCH)

    def all_ids(self, session: Session, gallery: StoredGallery) -> np.ndarray:
        parts = [np.zeros(0, dtype=np.int64)]
        for records in self.scroll_ids(gallery):
            parts.append(np.array([attached_ids.internal_of(r.id) for r in records], np.int64))
        return np.sort(np.concatenate(parts))

    def points(self, gallery: StoredGallery) -> int:
        """Points in the collection now."""
        source = self.source(gallery)
        with reachable(source), connection(self.settings, source).use() as client:
            return int(client.count(source.collection, exact=True).count)


class QdrantSearcher(AttachedSearcher[QdrantVectorStorage]):
    """The attached Qdrant collection behind the two index calls the search services make."""

    def search_with_points(
        self,
        queries: np.ndarray,
        k: int,
        *,
        overfetch: int = 4,
        min_candidates: int = 64,
        without: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(internal ids, float64 distances, float32 points) per query, nearest first, −1 / inf
        / NaN padded, as ``LorentzIndex.search_with_points``. The candidate sizes of the FAISS
        path do not apply: Qdrant's cosine top k is already the exact one. ``without``: only
        the points lacking that named vector (a mixed search's old list leaves the
        re-embedded points to their own vector's search; Qdrant filters, no overfetch)."""
        gallery = self._gallery
        source = self._storage.source(gallery)
        queries = np.asarray(queries, dtype=np.float64).reshape(-1, self.dim)
        ids, distances, points = no_hits(len(queries), k, self.dim)
        conn = connection(self._storage.settings, source)
        # A flat gallery asks a server for exact search (its HNSW is approximate); local mode
        # is always exact and warns about any search parameter.
        exact = models.SearchParams(exact=gallery.index_kind == "flat")
        params = None if conn.local else exact
        lacking = (
            None
            if without is None
            else models.Filter(must_not=[models.HasVectorCondition(has_vector=without)])
        )
        with_vector = self._storage._with_vectors(gallery)

        def request(query: np.ndarray, limit: int) -> models.QueryRequest:
            return models.QueryRequest(
                query=query.astype(np.float32).tolist(),
                using=source.vector,
                limit=limit,
                with_vector=with_vector,
                with_payload=False,
                params=params,
                filter=lacking,
            )

        for start in range(0, len(queries), SEARCH_BATCH):
            part = queries[start : start + SEARCH_BATCH]
            with reachable(source), conn.use() as client:
                answers = client.query_batch_points(
                    source.collection, requests=[request(q, k + 1) for q in part]
                )
            for offset, answer in enumerate(answers):
                row = start + offset
                hits = past_ties(asker(source, conn, request, part[offset]), answer.points, k)
                if not hits:
                    continue
                attached_ids.remember(gallery.id, [h.id for h in hits])
                hit_ids = np.array([attached_ids.internal_of(h.id) for h in hits], dtype=np.int64)
                vectors = self._storage._vectors(gallery, hits)
                at, dist, found = ranked_hits(
                    part[offset], vectors, gallery.lift_scale, gallery.lift_curv, k, ids=hit_ids
                )
                n = len(at)
                ids[row, :n] = hit_ids[at]
                distances[row, :n], points[row, :n] = dist, found
        return ids, distances, points


def qdrant_storage(settings: Settings) -> QdrantVectorStorage:
    return QdrantVectorStorage(settings)
