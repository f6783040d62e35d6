"""An attached pgvector table behind the vector-storage interface, read-only, and its exact
search — the pgvector twin of ``app.vectors.milvus.attached``.

The gallery's vectors are the table's rows with a vector (``app.vectors.pgvector.source`` says
where); the service never writes the owner's rows: ``upsert`` and ``delete`` refuse (the galleries
service refuses before them, with the same answer), and every connection here is read-only (an
in-place migration's own columns are written by ``app.vectors.pgvector.migration``). Reads go
to PostgreSQL on every call, so the API process holds nothing per gallery and a row the owner
adds or removes is seen at once. Item ids are the id column's values as strings (an integer in
decimal, a text id itself); internal ids come from ``app.vectors.attached_ids``, whose mapping and
table serve every attached engine.

Search (``PgvectorSearcher``): an attached gallery is a cosine gallery, whose points all lie at
one radius, so the Lorentz ranking of a query point is the cosine ranking of its space
components against the stored vectors. PostgreSQL orders the rows by pgvector's cosine distance
``<=>`` with index scans turned off for the transaction (``SET LOCAL enable_indexscan``): a
sequential scan, exact whatever index the owner built (an HNSW or IVFFlat index answers
approximately). The k best and ``TIE_ROOM`` more come back with their vectors, which, lifted as
the service lifts them, give the float64 distances and the order, ties by internal id
(``app.vectors.rerank.ranked_hits``, the re-rank every attached engine shares): the numbers and
order a copied gallery's exact search gives. A source attached with ``search = "hnsw"`` is
searched through the owner's HNSW index instead (``PgvectorStorage.search_rows``): approximate,
as the owner's own searches, and re-ranked the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from psycopg import sql
from sqlalchemy.orm import Session

from app.core.errors import conflict
from app.core.settings import Settings
from app.vectors import attached_ids
from app.vectors.attached import AttachedSearcher, KeyedStorage
from app.vectors.engine import SCAN_BATCH, Stored, StoredGallery
from app.vectors.pgvector.source import PgvectorSource, connected
from app.vectors.rerank import no_hits, ranked_hits

# Rows per page of a scan, and ids per lookup statement.
READ_BATCH = 1024
# Hits asked for past the k-th place (the re-rank keeps the k nearest, ties by id).
TIE_ROOM = 16
# pgvector's upper bound on ``hnsw.ef_search``.
MAX_EF_SEARCH = 1000


def vector_text(row: np.ndarray) -> str:
    """pgvector's text form of a row, ``[x1,x2,…]``: a float32's repr as a Python float reads
    back as the same float32 (and psycopg sends a string as it is, where a list of floats is
    converted element by element)."""
    return "[" + ",".join(repr(x) for x in np.asarray(row, dtype=np.float32).tolist()) + "]"


def from_send(sent: bytes) -> np.ndarray:
    """A ``vector``'s binary form (``vector_send``: its dimension and an unused int16, then
    big-endian float4s) as float32."""
    return np.frombuffer(sent, dtype=">f4", offset=4).astype(np.float32)


def read_only(gallery_id: str) -> Exception:
    return conflict(
        f"gallery {gallery_id} is an attached pgvector table: the service never writes its "
        "rows' own columns (only an in-place migration fills a column of its own); change its "
        "rows in PostgreSQL itself"
    )


class _Table:
    """The quoted names of one source's statements (``psycopg.sql``: never formatted text)."""

    def __init__(self, source: PgvectorSource) -> None:
        self.table = source.table_sql()
        self.id = sql.Identifier(source.id_column)
        self.vector = sql.Identifier(source.vector_column)
        # Read as float4 arrays (binary): a halfvec goes through vector, exactly.
        self.as_floats = sql.SQL("{}::vector::real[]").format(self.vector)
        self.ids_array = sql.SQL("text[]" if source.string_ids else "bigint[]")
        # The query in the column's own type, so that ``<=>`` compares like with like.
        self.query_type = sql.SQL("halfvec" if source.column_type == "halfvec" else "vector")


class PgvectorStorage(KeyedStorage[PgvectorSource]):
    name = "pgvector"

    def source(self, gallery: StoredGallery) -> PgvectorSource:
        return PgvectorSource.of(gallery.source or {})

    def refusal(self, gallery_id: str) -> Exception:
        return read_only(gallery_id)

    def _rows(
        self, gallery: StoredGallery, keys: list[int | str], vectors: bool
    ) -> list[tuple[Any, ...]]:
        """(id[, float4 vector]) of the rows among ``keys`` that have a vector."""
        source = self.source(gallery)
        names = _Table(source)
        columns = sql.SQL("{}, {}").format(names.id, names.as_floats) if vectors else names.id
        statement = sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s::{}) AND {} IS NOT NULL").format(
            columns, names.table, names.id, names.ids_array, names.vector
        )
        found: list[tuple[Any, ...]] = []
        with connected(self.settings, source) as conn, conn.cursor(binary=True) as cur:
            for start in range(0, len(keys), READ_BATCH):
                found.extend(cur.execute(statement, (keys[start : start + READ_BATCH],)))
        attached_ids.remember(gallery.id, [row[0] for row in found])
        return found

    def lookup(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        rows = self._rows(gallery, self._keys(gallery, item_ids), vectors=False)
        return {
            attached_ids.item_id(key): (attached_ids.internal_of(key), None)
            for key in sorted(row[0] for row in rows)
        }

    def fetch(self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]) -> Stored:
        wanted = self._keys(gallery, item_ids)
        found = {row[0]: row[1] for row in self._rows(gallery, wanted, vectors=True)}
        keys = [key for key in wanted if key in found]
        ids = np.array([attached_ids.internal_of(k) for k in keys], dtype=np.int64)
        vectors = np.array([found[k] for k in keys], dtype=np.float32).reshape(
            len(keys), gallery.dim
        )
        n = len(keys)
        return Stored([attached_ids.item_id(k) for k in keys], ids, vectors, [None] * n, [None] * n)

    def _pages(
        self, gallery: StoredGallery, vectors: bool, batch: int, mapped_only: bool = False
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows with a vector, (id[, float4 vector]), in pages ascending by id (keyset
        paging: each page one statement). ``mapped_only``: integer ids outside [0, 2⁶²) only."""
        source = self.source(gallery)
        names = _Table(source)
        columns = sql.SQL("{}, {}").format(names.id, names.as_floats) if vectors else names.id
        only = (
            sql.SQL(" AND ({} < 0 OR {} >= {})").format(
                names.id, names.id, sql.Literal(attached_ids.PLAIN_LIMIT)
            )
            if mapped_only and not source.string_ids
            else sql.SQL("")
        )
        first = sql.SQL("SELECT {} FROM {} WHERE {} IS NOT NULL{} ORDER BY {} LIMIT %s").format(
            columns, names.table, names.vector, only, names.id
        )
        after = sql.SQL(
            "SELECT {} FROM {} WHERE {} IS NOT NULL{} AND {} > %s ORDER BY {} LIMIT %s"
        ).format(columns, names.table, names.vector, only, names.id, names.id)
        with connected(self.settings, source) as conn, conn.cursor(binary=True) as cur:
            page = cur.execute(first, (batch,)).fetchall()
            while page:
                attached_ids.remember(gallery.id, [row[0] for row in page])
                yield page
                if len(page) < batch:
                    return
                page = cur.execute(after, (page[-1][0], batch)).fetchall()

    def scan(
        self, session: Session, gallery: StoredGallery, batch: int = SCAN_BATCH
    ) -> Iterator[Stored]:
        """Every row with a vector, in batches, each ascending by internal id."""
        for page in self._pages(gallery, vectors=True, batch=min(batch, READ_BATCH)):
            ids = np.array([attached_ids.internal_of(row[0]) for row in page], dtype=np.int64)
            order = np.argsort(ids, kind="stable")
            vectors = np.asarray([page[i][1] for i in order.tolist()], dtype=np.float32)
            items = [attached_ids.item_id(page[i][0]) for i in order.tolist()]
            n = len(items)
            yield Stored(items, ids[order], vectors.reshape(n, gallery.dim), [None] * n, [None] * n)

    def mapped_keys(self, gallery: StoredGallery) -> Iterator[list[int | str]]:
        """The ids that are not their own internal id, in pages (the attach records them,
        ``attached_ids.record``): every text id, and of integer ids only those outside [0, 2⁶²)."""
        for page in self._pages(gallery, vectors=False, batch=10 * READ_BATCH, mapped_only=True):
            yield [row[0] for row in page]

    def all_ids(self, session: Session, gallery: StoredGallery) -> np.ndarray:
        parts = [np.zeros(0, dtype=np.int64)]
        for page in self._pages(gallery, vectors=False, batch=10 * READ_BATCH):
            parts.append(np.array([attached_ids.internal_of(row[0]) for row in page], np.int64))
        return np.sort(np.concatenate(parts))

    def points(self, gallery: StoredGallery) -> int:
        """Rows with a vector in the table now."""
        source = self.source(gallery)
        names = _Table(source)
        statement = sql.SQL("SELECT count({}) FROM {}").format(names.vector, names.table)
        with connected(self.settings, source) as conn:
            return int(conn.execute(statement).fetchone()[0])  # type: ignore[index]

    def search_rows(
        self,
        gallery: StoredGallery,
        queries: np.ndarray,
        limit: int,
        without: Sequence[Any] = (),
        lacking: str | None = None,
    ) -> list[list[tuple[Any, np.ndarray]]]:
        """Per query the ``limit`` rows nearest by cosine distance, (id, float4 vector), nearest
        first. ``without``: ids left out; ``lacking``: only the rows whose column of that name is
        NULL (an in-place migration's old list: the rows without the model's vector).

        With ``search = "exact"`` (the default) a sequential scan, index scans off for the
        transaction, ties by id: the exact answer. With ``"hnsw"`` the owner's HNSW index
        (ordered by ``distance``'s operator, which ranks as cosine on the rows the attach
        accepted) at ``hnsw.ef_search`` = max(``ef_search``, ``limit``): approximate, as the
        owner's own index searches. A filtered search walks the index on past what the filter
        drops (``hnsw.iterative_scan``, pgvector 0.8 and later) or, on an older pgvector, is
        exact; a query the index answers with fewer than ``limit`` rows (a small table, a
        filter that drops most rows) is answered again exactly, so an index never loses rows."""
        source = self.source(gallery)
        names = _Table(source)
        skip = (
            sql.SQL(" AND NOT ({} = ANY(%(without)s::{}))").format(names.id, names.ids_array)
            if len(without)
            else sql.SQL("")
        )
        if lacking is not None:
            skip = sql.SQL("{} AND {} IS NULL").format(skip, sql.Identifier(lacking))
        filtered = bool(len(without)) or lacking is not None
        indexed = source.search == "hnsw" and (not filtered or source.iterative_scan)
        # The best rows first (ids and vectors only), then their vectors in pgvector's binary
        # form (``vector_send``, read by numpy: a float array converted element by element in
        # Python cost more than the search itself): computed for the hits alone, where a
        # projection in the scan itself would compute it for every row of the table.
        ordered = sql.SQL(
            "SELECT key, vector_send(vec::vector) FROM (SELECT {id} AS key, {vector} AS vec, "
            "{order} AS distance FROM {table} WHERE {vector} IS NOT NULL{skip} ORDER BY {by} "
            "LIMIT %(limit)s) AS hits ORDER BY distance, key"
        )

        def statement(operator: str, by_id: bool) -> sql.Composed:
            order = sql.SQL("{} {} %(query)s::{}").format(
                names.vector, sql.SQL(operator), names.query_type
            )
            by = sql.SQL("{}, {}").format(order, names.id) if by_id else order
            return ordered.format(
                id=names.id, vector=names.vector, order=order, table=names.table, skip=skip, by=by
            )

        exact = statement("<=>", by_id=True)
        # No second key: an index scan returns rows in the operator's order only.
        through_index = statement(source.operator, by_id=False)
        rows_of: list[list[Any] | None] = []
        queries = np.asarray(queries, dtype=np.float32)
        with connected(self.settings, source) as conn, conn.cursor(binary=True) as cur:
            if indexed:
                ef = min(max(source.ef_search, limit), MAX_EF_SEARCH)
                cur.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                if filtered:
                    cur.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
                for query in queries:
                    params = {"query": vector_text(query), "limit": limit, "without": list(without)}
                    rows = cur.execute(through_index, params).fetchall()
                    rows_of.append(rows if len(rows) == limit else None)
            else:
                rows_of = [None] * len(queries)
            if any(rows is None for rows in rows_of):
                # Whatever the owner's defaults for the database or role (``enable_seqscan``
                # off to force its index, say): a sequential scan, the only exact plan.
                cur.execute("SET LOCAL enable_seqscan = on")
                cur.execute("SET LOCAL enable_indexscan = off")
                cur.execute("SET LOCAL enable_bitmapscan = off")
                for at, query in enumerate(queries):
                    if rows_of[at] is None:
                        params = {
                            "query": vector_text(query),
                            "limit": limit,
                            "without": list(without),
                        }
                        rows_of[at] = cur.execute(exact, params).fetchall()
        return [[(key, from_send(sent)) for key, sent in rows or ()] for rows in rows_of]


class PgvectorSearcher(AttachedSearcher[PgvectorStorage]):
    """The attached pgvector table behind the two index calls the search services make."""

    def search_with_points(
        self,
        queries: np.ndarray,
        k: int,
        *,
        overfetch: int = 4,
        min_candidates: int = 64,
        without: Sequence[int | str] = (),
        lacking: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(internal ids, float64 distances, float32 points) per query, nearest first, −1 / inf
        / NaN padded, as ``LorentzIndex.search_with_points``. The candidate sizes of the FAISS
        path do not apply: the exact cosine top k is the answer. ``without``: ids left out;
        ``lacking``: rows whose column of that name is set left out (``search_rows``)."""
        gallery = self._gallery
        queries = np.asarray(queries, dtype=np.float64).reshape(-1, self.dim)
        ids, distances, points = no_hits(len(queries), k, self.dim)
        # Past the k-th place: a tie across it (duplicate documents) is then ordered by id
        # whole, as every engine orders ties (``lorentz_rows.nearest_first``).
        answers = self._storage.search_rows(gallery, queries, k + TIE_ROOM, without, lacking)
        for row, hits in enumerate(answers):
            if not hits:
                continue
            keys = [key for key, _ in hits]
            attached_ids.remember(gallery.id, keys)
            hit_ids = np.array([attached_ids.internal_of(key) for key in keys], dtype=np.int64)
            vectors = np.stack([vector for _, vector in hits])
            at, dist, found = ranked_hits(
                queries[row], vectors, gallery.lift_scale, gallery.lift_curv, k, ids=hit_ids
            )
            n = len(at)
            ids[row, :n] = hit_ids[at]
            distances[row, :n], points[row, :n] = dist, found
        return ids, distances, points


def pgvector_storage(settings: Settings) -> PgvectorStorage:
    return PgvectorStorage(settings)
