"""Top-k ids of your pgvector table of OLD vectors for NEW backbone query features."""

import psycopg
from onnx_query import query_vectors
from psycopg import sql


def vector_literal(q) -> str:
    return "[" + ",".join(repr(x) for x in q.tolist()) + "]"  # pgvector's text form


def search_pgvector(
    model_zip: str, features, conn: psycopg.Connection, table: str, column: str, k: int = 10
) -> list[list]:
    # <=> is pgvector's cosine distance (smaller is nearer); an index needs vector_cosine_ops.
    query = sql.SQL("SELECT id FROM {} ORDER BY {} <=> %s::vector LIMIT %s").format(
        sql.Identifier(table), sql.Identifier(column)
    )
    return [
        [row[0] for row in conn.execute(query, (vector_literal(q), k))]
        for q in query_vectors(model_zip, features)
    ]
