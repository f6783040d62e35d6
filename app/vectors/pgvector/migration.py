"""An in-place migration's vectors in an attached pgvector table: the re-embedded items' new
features in a column ``nobackfill_<model id>`` of type ``vector(D)`` that the service adds to the
owner's own table — the pgvector twin of ``app.vectors.qdrant.named`` and
``app.vectors.milvus.sibling``.

Why a column of the same rows (as Qdrant's named vector, not Milvus's sibling collection):
PostgreSQL adds a nullable column without a default as a catalog change only (``ALTER TABLE …
ADD COLUMN``: no table rewrite, the table's file stays the same one), a row the owner deletes
takes its new vector with it, and the two lists of a mixed search come from one table split by
``column IS NULL``, so they never overlap. The service writes that column only (one ``UPDATE …
SET <column> = … WHERE <id column> = … AND <vector column> IS NOT NULL`` per batch, ``RETURNING``
the rows it found: a row deleted since the plan is simply not among them) and never the owner's
vector column or any other.

Provenance: the column's comment (``COMMENT ON COLUMN``) is a JSON object naming the service, the
model and the dimension; it is what marks a column the service's own. A column of the same name
without it is the owner's: never altered, written or dropped (409). Deleting the model or the
gallery with ``?cascade=true`` drops the column (``forget_models``), which drops its index with
it; the table's other columns and indexes stay.

Index: only when the owner asked on attach (``source.migration_hnsw``), an HNSW index
``<column>_hnsw`` with the operator class of the source's ``distance``, for the owner's own
searches of the column; the service's searches are exact (a sequential scan, index scans off)
and never use it.

The service's database user must own the table (PostgreSQL lets only the owner add or drop a
column): otherwise an in-place write answers 409 saying so, and nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import errors, sql

from app.core.errors import conflict
from app.core.settings import Settings
from app.ml.backfill.mixed import unit_rows
from app.vectors import attached_ids
from app.vectors.engine import StoredGallery
from app.vectors.lorentz_rows import best_by_id
from app.vectors.pgvector.source import (
    IDENTIFIER,
    MIGRATION_PREFIX,
    PgvectorSource,
    connected,
)
from app.vectors.pgvector.storage import READ_BATCH, TIE_ROOM, PgvectorStorage, vector_text

log = logging.getLogger(__name__)
SERVICE = "nobackfill"
INDEX_SUFFIX = "_hnsw"
# pgvector's HNSW operator class for each ``distance`` an attach accepts.
OPERATOR_CLASSES = {
    "cosine": "vector_cosine_ops",
    "inner_product": "vector_ip_ops",
    "l2": "vector_l2_ops",
}


def migration_column(model_id: str) -> str:
    """The column holding ``model_id``'s re-embedded items (and its index's name fits too)."""
    name = MIGRATION_PREFIX + model_id
    if not IDENTIFIER.fullmatch(name + INDEX_SUFFIX):
        raise conflict(
            f"model id {model_id!r} makes no PostgreSQL column name ({name[:70]!r}): an "
            "in-place migration of a pgvector table needs a plain name of at most 63 bytes"
        )
    return name


def index_name(column: str) -> str:
    return column + INDEX_SUFFIX


def provenance(model_id: str, dim: int) -> str:
    """The column's comment: what says the service added it, for which model."""
    return json.dumps({"service": SERVICE, "model_id": model_id, "dim": dim}, sort_keys=True)


def _ours(comment: str | None, model_id: str) -> bool:
    try:
        found = json.loads(comment or "")
    except ValueError:
        return False
    return (
        isinstance(found, dict)
        and found.get("service") == SERVICE
        and (found.get("model_id") == model_id)
    )


def _column(
    conn: psycopg.Connection, source: PgvectorSource, name: str
) -> tuple[str, int, str | None] | None:
    """(type name, type modifier, comment) of the table's column ``name``; None without one."""
    schema, table = source.schema_table
    row = conn.execute(
        "SELECT t.typname, a.atttypmod, col_description(c.oid, a.attnum) FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_type t ON t.oid = a.atttypid WHERE n.nspname = %s AND c.relname = %s "
        "AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped",
        (schema, table, name),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), row[2])


def _checked_dim(found: tuple[str, int, str | None] | None, name: str, model_id: str) -> int | None:
    """The service's column's dimension (None: no such column); 409 when the table has a column
    of that name that the service did not add (not the service's to change)."""
    if found is None:
        return None
    typname, dim, comment = found
    if typname != "vector" or not _ours(comment, model_id):
        raise conflict(
            f"the table's column {name!r} is not an in-place migration's column of model "
            f"{model_id} (a vector column whose comment names the model); it is not the "
            "service's to change"
        )
    return dim


@contextlib.contextmanager
def _writing(settings: Settings, source: PgvectorSource) -> Iterator[psycopg.Connection]:
    """A connection that may write (``connected(writes=True)``: the same rules, one
    transaction, rolled back on any error); a privilege the service's user lacks is a 409
    saying which."""
    with connected(settings, source, writes=True) as conn:
        try:
            yield conn
        except errors.InsufficientPrivilege as exc:
            raise conflict(
                f"the service's database user may not change table {source.table!r}: an "
                "in-place migration adds a column to it and fills it (PostgreSQL lets only the "
                "table's owner add a column). Attach it with the owner's user to migrate it in "
                "place; nothing was written"
            ) from exc


def shape(settings: Settings, source: PgvectorSource, model_id: str) -> int | None:
    """The model's column's dimension, None when the table has no such column; 409 when a
    column of that name is not one the service added."""
    name = migration_column(model_id)
    with connected(settings, source) as conn:
        return _checked_dim(_column(conn, source, name), name, model_id)


def ensure_column(settings: Settings, source: PgvectorSource, model_id: str, dim: int) -> None:
    """Add the model's ``vector(dim)`` column (nullable, no default: no rewrite) and its
    provenance unless the table has it, and its HNSW index when the owner asked for one
    (``source.migration_hnsw``); 409 when the column exists with another dimension."""
    name = migration_column(model_id)
    table, column = source.table_sql(), sql.Identifier(name)
    with _writing(settings, source) as conn:
        existing = _checked_dim(_column(conn, source, name), name, model_id)
        if existing is None:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} vector({})").format(
                    table, column, sql.Literal(int(dim))
                )
            )
            conn.execute(
                sql.SQL("COMMENT ON COLUMN {} IS {}").format(
                    sql.Identifier(*source.schema_table, name),
                    sql.Literal(provenance(model_id, dim)),
                )
            )
        elif existing != dim:
            raise conflict(
                f"the table's column {name!r} holds {existing}-dimensional vectors, not the "
                f"model's {dim}-dimensional features; it is not the service's to change"
            )
        if source.migration_hnsw:
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw ({} {})").format(
                    sql.Identifier(index_name(name)),
                    table,
                    column,
                    sql.SQL(OPERATOR_CLASSES[source.distance]),
                )
            )


def write(
    settings: Settings,
    source: PgvectorSource,
    model_id: str,
    keys: Sequence[int | str],
    features: np.ndarray,
) -> set[int | str]:
    """The model's column of the rows ``keys`` (rows of ``features``) that still have their
    old vector, in one transaction; returns the keys written (the others' rows are gone)."""
    name = migration_column(model_id)
    statement = sql.SQL(
        "UPDATE {table} AS t SET {column} = v.vec::vector "
        "FROM unnest(%s::{ids}, %s::text[]) AS v(key, vec) "
        "WHERE t.{id} = v.key AND t.{vector} IS NOT NULL RETURNING t.{id}"
    ).format(
        table=source.table_sql(),
        column=sql.Identifier(name),
        ids=sql.SQL("text[]" if source.string_ids else "bigint[]"),
        id=sql.Identifier(source.id_column),
        vector=sql.Identifier(source.vector_column),
    )
    written: set[int | str] = set()
    with _writing(settings, source) as conn:
        for start in range(0, len(keys), READ_BATCH):
            part = list(keys[start : start + READ_BATCH])
            rows = [vector_text(r) for r in features[start : start + READ_BATCH]]
            written.update(row[0] for row in conn.execute(statement, (part, rows)))
    return written


def forget_models(
    settings: Settings, gallery_id: str, source: PgvectorSource, model_ids: Iterable[str]
) -> None:
    """Drop each model's column (and with it its index) once its re-embedded items were deleted
    (committed): everything the service wrote for the model lies there. A column of that name
    the service did not add stays. Best effort: a database out of reach keeps it (logged); no
    search of the service reads it any more."""
    for model_id in model_ids:
        try:
            name = migration_column(model_id)
            with _writing(settings, source) as conn:
                found = _column(conn, source, name)
                if found is None or not _ours(found[2], model_id):
                    continue
                conn.execute(
                    sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS {}").format(
                        source.table_sql(), sql.Identifier(name)
                    )
                )
        except Exception:
            log.warning(
                "could not drop model %s's column of gallery %s's table %s",
                model_id,
                gallery_id,
                source.table,
                exc_info=True,
            )


def search_vector(
    storage: PgvectorStorage,
    gallery: StoredGallery,
    model_id: str,
    features: np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(internal ids, cosines) of the k rows nearest each row of ``features`` by the model's
    column, best first (ids −1 padded), among the rows that still have their old vector (the
    gallery's items). Exact: ordered by pgvector's cosine distance ``<=>`` in a sequential scan
    (index scans off, as ``PgvectorStorage.search_rows``), ``TIE_ROOM`` more than k fetched;
    the cosines are recomputed from the hits' vectors in float32 as the service's own scan of
    re-embedded features computes them, ties by id, so the merge scores a hit the same wherever
    its features are kept."""
    source = storage.source(gallery)
    column = sql.Identifier(migration_column(model_id))
    ident = sql.Identifier(source.id_column)
    statement = sql.SQL(
        "SELECT {id}, {column}::real[] FROM {table} WHERE {column} IS NOT NULL "
        "AND {vector} IS NOT NULL ORDER BY {column} <=> %s::real[]::vector, {id} LIMIT %s"
    ).format(
        id=ident,
        column=column,
        table=source.table_sql(),
        vector=sql.Identifier(source.vector_column),
    )
    queries = unit_rows(features)
    nq = len(queries)
    ids = np.full((nq, k), -1, dtype=np.int64)
    cosines = np.full((nq, k), -1.0, dtype=np.float32)
    with connected(storage.settings, source) as conn, conn.cursor(binary=True) as cur:
        cur.execute("SET LOCAL enable_seqscan = on")
        cur.execute("SET LOCAL enable_indexscan = off")
        cur.execute("SET LOCAL enable_bitmapscan = off")
        for row, query in enumerate(queries):
            hits: list[Any] = cur.execute(statement, (query.tolist(), k + TIE_ROOM)).fetchall()
            if not hits:
                continue
            attached_ids.remember(gallery.id, [key for key, _ in hits])
            hit_ids = np.array([attached_ids.internal_of(key) for key, _ in hits], np.int64)
            found = unit_rows(np.asarray([vector for _, vector in hits], dtype=np.float32))
            best, scores = best_by_id(hit_ids[None], (found @ query)[None], k)
            ids[row, : best.shape[1]] = best[0]
            cosines[row, : best.shape[1]] = scores[0]
    return ids, cosines


def keys_of(source: PgvectorSource, item_ids: Sequence[str]) -> list[int | str]:
    """The distinct keys the item ids name (ids naming none left out)."""
    keys = (attached_ids.key_of(item, source.string_ids) for item in item_ids)
    return list(dict.fromkeys(key for key in keys if key is not None))


def read_vectors(
    storage: PgvectorStorage, gallery: StoredGallery, model_id: str, item_ids: Sequence[str]
) -> tuple[list[str], np.ndarray]:
    """(item ids, their rows of the model's column) of the items whose row has one (none when
    the table has no such column yet)."""
    source = storage.source(gallery)
    if shape(storage.settings, source, model_id) is None:
        return [], np.zeros((0, 0), dtype=np.float32)
    column = sql.Identifier(migration_column(model_id))
    ident = sql.Identifier(source.id_column)
    statement = sql.SQL(
        "SELECT {id}, {column}::real[] FROM {table} WHERE {id} = ANY(%s::{ids}) "
        "AND {column} IS NOT NULL AND {vector} IS NOT NULL ORDER BY {id}"
    ).format(
        id=ident,
        column=column,
        table=source.table_sql(),
        ids=sql.SQL("text[]" if source.string_ids else "bigint[]"),
        vector=sql.Identifier(source.vector_column),
    )
    keys = keys_of(source, item_ids)
    items: list[str] = []
    rows: list[Any] = []
    with connected(storage.settings, source) as conn, conn.cursor(binary=True) as cur:
        for start in range(0, len(keys), READ_BATCH):
            for key, vector in cur.execute(statement, (keys[start : start + READ_BATCH],)):
                items.append(attached_ids.item_id(key))
                rows.append(vector)
    return items, np.asarray(rows, dtype=np.float32).reshape(len(items), -1)
