"""Document texts of an attached pgvector table's rows, for a two-stage search and a re-embed job
on it (issue 43, item 2) — the pgvector twin of ``app.vectors.qdrant.texts`` and
``app.vectors.milvus.texts``: the texts come from the text column the attach named and checked
(``source.text_field``), read-only, one statement per batch of ids; the model's vectors from the
in-place migration's column (``app.vectors.pgvector.migration.read_vectors``).

Rows whose text is null or blank, and rows without a vector (no item of the gallery), are left
out; the callers skip and count them.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from app.vectors import attached_ids
from app.vectors.engine import StoredGallery
from app.vectors.pgvector.migration import keys_of
from app.vectors.pgvector.source import connected
from app.vectors.pgvector.storage import READ_BATCH, PgvectorStorage


def read_texts(
    storage: PgvectorStorage, gallery: StoredGallery, field: str, item_ids: Sequence[str]
) -> dict[str, str]:
    """item id → its text, for the rows that exist, have a vector and a non-blank ``field``."""
    source = storage.source(gallery)
    ident = sql.Identifier(source.id_column)
    statement = sql.SQL(
        "SELECT {id}, {field} FROM {table} WHERE {id} = ANY(%s::{ids}) "
        "AND {vector} IS NOT NULL AND {field} IS NOT NULL"
    ).format(
        id=ident,
        field=sql.Identifier(field),
        table=source.table_sql(),
        ids=sql.SQL("text[]" if source.string_ids else "bigint[]"),
        vector=sql.Identifier(source.vector_column),
    )
    keys = keys_of(source, item_ids)
    out: dict[str, str] = {}
    with connected(storage.settings, source) as conn:
        for start in range(0, len(keys), READ_BATCH):
            for key, text in conn.execute(statement, (keys[start : start + READ_BATCH],)):
                if isinstance(text, str) and text.strip():
                    out[attached_ids.item_id(key)] = text
    return out
