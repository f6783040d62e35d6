"""A pgvector table attached as a gallery's source: where it is, what the service may connect
to, and the checks of its shape — the pgvector twin of ``app.vectors.milvus.source``.

A gallery with ``vector_storage = "pgvector"`` keeps no vector of its own: its
``source`` (a JSON column) names a database (``dsn``), a table (``table`` or ``schema.table``),
its id column (an integer or text primary key / unique column: the item ids) and its vector
column (``vector(D)`` or ``halfvec(D)``). The service only reads it: every connection opens
with ``default_transaction_read_only`` on, except those of an in-place migration
(``connected(writes=True)``, ``app.vectors.pgvector.migration``), which add, fill and drop the
service's own ``nobackfill_<model id>`` columns and never write any other.

Multi-tenant rules (``app.vectors.source_rules``), checked on attach and again on every
connect:

* the ``dsn`` must name the database of an entry of ``settings.pgvector_allowed_dsns`` (same
  host or socket folder, port and database; none by default), carry only the libpq keys of
  ``source_rules.DSN_KEYS`` and no password;
* the password comes only from the server environment variable ``password_env``, whose name
  must carry ``settings.pgvector_password_env_prefix`` (as Qdrant's API keys);
* the service's own database is never a source: its tables hold every tenant's rows.

Identifiers are validated (``IDENTIFIER``) and always sent quoted (``psycopg.sql.Identifier``),
never formatted into the SQL text.

Distance: an attached gallery is a cosine gallery (the methods lift unit vectors), so exact
search orders by pgvector's cosine distance ``<=>`` whatever ``distance`` names. ``distance``
records how the owner searches the table; ``inner_product`` and ``l2`` rank as cosine only on
unit-length rows, so those are attached only when every row is unit length (checked on
attach and by each job's recheck), refused rather than trusted otherwise.

Search mode: ``search = "exact"`` (the default) scans the table; ``"hnsw"`` goes through the
owner's HNSW index on the vector column, which must exist with the operator class of
``distance`` (checked on attach: ``hnsw_opclasses``), ordered by that operator at ``ef_search``
(``app.vectors.pgvector.storage``). pgvector's version is recorded on attach: iterative index
scans (filtered searches through the index) need 0.8.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import conninfo, errors, sql

from app.core.errors import Problem, conflict, invalid, unavailable
from app.core.settings import Settings
from app.vectors import source_rules
from app.vectors.pgvector.connections import pooled
from app.vectors.source_rules import dsn_allowed, dsn_parts, dsn_place, env_secret

ENGINE = "pgvector"
DISTANCES = ("cosine", "inner_product", "l2")
COLUMN_TYPES = ("vector", "halfvec")
INTEGER_TYPES = ("int2", "int4", "int8")
TEXT_TYPES = ("text", "varchar", "bpchar")
# An unquoted-style PostgreSQL name (at most 63 bytes, the server's NAMEDATALEN − 1): anything
# else is refused before it reaches SQL, and what passes is still sent quoted.
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
# Seconds a client is told to wait before retrying after the table could not be reached.
RETRY_AFTER_S = 5
# How far from 1 a row's norm may be for inner_product / l2 to rank as cosine.
UNIT_TOLERANCE = 1e-3
# The columns an in-place migration adds are named with this prefix (``migration``).
MIGRATION_PREFIX = "nobackfill_"
# How the service searches the owner's vector column: "exact" (a sequential scan, the default)
# or "hnsw" (the owner's HNSW index on it, ``storage.PgvectorStorage.search_rows``).
SEARCH_MODES = ("exact", "hnsw")
# pgvector's own default ``hnsw.ef_search``: what the owner's own searches of the index use
# unless they set it, so the service's answers are the owner's unless asked otherwise.
DEFAULT_EF_SEARCH = 40
# pgvector's operator for each ``distance`` (its HNSW operator classes index one each).
OPERATORS = {"cosine": "<=>", "inner_product": "<#>", "l2": "<->"}
OPCLASS_SUFFIXES = {"cosine": "_cosine_ops", "inner_product": "_ip_ops", "l2": "_l2_ops"}
# The first pgvector release with iterative index scans (``hnsw.iterative_scan``): a filtered
# search (the old list of a transition search) then walks the index past what the filter drops.
ITERATIVE_SCAN_SINCE = (0, 8, 0)


@dataclass(frozen=True)
class PgvectorSource:
    dsn: str
    table: str  # "name" or "schema.name"
    id_column: str
    vector_column: str
    distance: str = "cosine"
    password_env: str | None = None
    text_field: str | None = None
    # The owner's choice on attach: an HNSW index (the operator class of ``distance``) on each
    # column an in-place migration adds, for the owner's own searches of it.
    migration_hnsw: bool = False
    # "exact" or "hnsw" (``SEARCH_MODES``) and, for "hnsw", the index's ``hnsw.ef_search``.
    search: str = "exact"
    ef_search: int = DEFAULT_EF_SEARCH
    # Learnt on attach: "int" or "text" ids, "vector" or "halfvec" column, pgvector's version.
    id_type: str | None = None
    column_type: str | None = None
    pgvector_version: str | None = None

    @classmethod
    def of(cls, source: dict[str, Any]) -> PgvectorSource:
        return cls(
            dsn=source["dsn"],
            table=source["table"],
            id_column=source["id_column"],
            vector_column=source["vector_column"],
            distance=source.get("distance", "cosine"),
            password_env=source.get("password_env"),
            text_field=source.get("text_field"),
            migration_hnsw=bool(source.get("migration_hnsw", False)),
            search=source.get("search", "exact"),
            ef_search=int(source.get("ef_search", DEFAULT_EF_SEARCH)),
            id_type=source.get("id_type"),
            column_type=source.get("column_type"),
            pgvector_version=source.get("pgvector_version"),
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": ENGINE,
            "dsn": self.dsn,
            "table": self.table,
            "id_column": self.id_column,
            "vector_column": self.vector_column,
            "distance": self.distance,
        }
        optional = {
            "password_env": self.password_env,
            "text_field": self.text_field,
            "id_type": self.id_type,
            "column_type": self.column_type,
            "pgvector_version": self.pgvector_version,
        }
        out.update({key: value for key, value in optional.items() if value is not None})
        if self.migration_hnsw:
            out["migration_hnsw"] = True
        if self.search != "exact":
            out["search"], out["ef_search"] = self.search, self.ef_search
        return out

    @property
    def operator(self) -> str:
        """pgvector's distance operator for ``distance`` (what the owner's index orders by)."""
        return OPERATORS[self.distance]

    @property
    def iterative_scan(self) -> bool:
        """Whether the server's pgvector walks an index past a filter (0.8 and later)."""
        return version_tuple(self.pgvector_version) >= ITERATIVE_SCAN_SINCE

    @property
    def string_ids(self) -> bool:
        return self.id_type == "text"

    @property
    def schema_table(self) -> tuple[str, str]:
        schema, _, name = self.table.rpartition(".")
        return schema or "public", name

    def table_sql(self) -> sql.Identifier:
        return sql.Identifier(*self.schema_table)


def version_tuple(version: str | None) -> tuple[int, ...]:
    """``"0.8.2"`` → (0, 8, 2); () when unknown or not numeric (so below every release)."""
    parts = re.findall(r"\d+", version or "")
    return tuple(int(part) for part in parts[:3])


@dataclass(frozen=True)
class TableShape:
    dim: int
    count: int
    id_type: str
    column_type: str
    pgvector_version: str | None = None


def check_names(source: PgvectorSource) -> None:
    """422 naming the field whose identifier is not a plain PostgreSQL name."""
    names = {
        "source.id_column": [source.id_column],
        "source.vector_column": [source.vector_column],
        "source.table": source.table.split("."),
    }
    if source.text_field is not None:
        names["source.text_field"] = [source.text_field]
    for field, parts in names.items():
        if len(parts) > 2 or not all(IDENTIFIER.fullmatch(part) for part in parts):
            raise invalid(field, "a PostgreSQL name: a letter or _, then letters, digits, _ or $")
    if source.distance not in DISTANCES:
        raise invalid("source.distance", f"one of {', '.join(DISTANCES)}")
    if source.search not in SEARCH_MODES:
        raise invalid("source.search", f"one of {', '.join(SEARCH_MODES)}")
    if source.vector_column.startswith(MIGRATION_PREFIX):
        # A migration's column holds only the re-embedded rows, in the new model's space:
        # searched alone it would answer for half the gallery, unmerged.
        raise invalid(
            "source.vector_column",
            f"{source.vector_column!r} holds the service's re-embedded vectors of an in-place "
            "migration; attach the table's own vector column and search the re-embedded ones "
            "through the model (a transition or mixed search)",
        )


def allowed_dsn(settings: Settings, dsn: str) -> dict[str, str]:
    """The DSN's parts (``source_rules.dsn_parts``) when the service may connect to it; 422 on
    ``source.dsn`` otherwise."""
    try:
        given = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise invalid("source.dsn", f"not a PostgreSQL DSN: {exc}") from exc
    if given.get("password"):
        raise invalid(
            "source.dsn",
            "carries a password: name a server environment variable holding it in "
            "source.password_env instead",
        )
    parts = dsn_parts(dsn)
    if parts is None:
        raise invalid(
            "source.dsn",
            "needs a host (or socket folder) and a database, and may carry only "
            f"{', '.join(sorted(source_rules.DSN_KEYS))}",
        )
    if not dsn_allowed(settings.pgvector_allowed_dsns, dsn):
        raise invalid(
            "source.dsn",
            "not an allowed database: the operator lists the databases tenants may attach in "
            f"NOBACKFILL_PGVECTOR_ALLOWED_DSNS ({len(settings.pgvector_allowed_dsns)} allowed)",
        )
    own = settings.resolved_database_url.replace("postgresql+psycopg://", "postgresql://")
    if own.startswith("postgresql://") and dsn_place(own) == dsn_place(dsn):
        raise invalid("source.dsn", "the service's own database cannot be attached")
    return parts


def password(settings: Settings, name: str | None) -> str | None:
    return env_secret(settings.pgvector_password_env_prefix, name, "source.password_env")


def is_unreachable(exc: BaseException) -> bool:
    """A transport failure (refused, lost, timed out, the server shutting down) as opposed to an
    answer about the table."""
    return isinstance(
        exc,
        psycopg.OperationalError
        | errors.AdminShutdown
        | errors.CannotConnectNow
        | errors.QueryCanceled
        | ConnectionError
        | TimeoutError,
    )


def _changed(exc: BaseException) -> bool:
    """The table or one of its columns is gone, its type changed, or the service's user may no
    longer read it, since the attach."""
    return isinstance(
        exc,
        errors.InsufficientPrivilege
        | errors.UndefinedColumn
        | errors.UndefinedTable
        | errors.InvalidSchemaName
        | errors.DatatypeMismatch
        | errors.UndefinedFunction,
    )


@contextlib.contextmanager
def connected(
    settings: Settings, source: PgvectorSource, writes: bool = False
) -> Iterator[psycopg.Connection]:
    """A read-only connection to the source's database, checked against the rules first,
    closed after (committed when the block ends without an error, rolled back otherwise).
    While it is used: the server out of reach answers 503 with Retry-After, the table or a
    column gone (its owner dropped it) 409; nothing is written either way. ``writes``: an
    in-place migration's connection, the one kind that may write (the service's own columns
    only, ``app.vectors.pgvector.migration``), under the same rules, and waiting for a table
    lock no longer than a statement may run (``lock_timeout``: an owner's long transaction
    makes the migration answer 503, it does not queue the owner's other sessions behind it)."""
    parts = allowed_dsn(settings, source.dsn)
    secret = password(settings, source.password_env)
    timeout_ms = int(settings.pgvector_timeout_s * 1000)
    mode = f"-c lock_timeout={timeout_ms}" if writes else "-c default_transaction_read_only=on"
    params: dict[str, Any] = {
        **parts,
        "connect_timeout": max(1, int(settings.pgvector_timeout_s)),
        "application_name": "nobackfill",
        "options": f"{mode} -c statement_timeout={timeout_ms}",
    }
    if secret is not None:
        params["password"] = secret
    try:
        if writes:
            with psycopg.connect(**params) as conn:
                yield conn
        else:
            # Read-only: kept for the next search (``connections``: a connection per request
            # cost ten times an indexed search).
            with pooled(params, settings.pgvector_idle_connections) as conn:
                yield conn
    except Problem:
        raise
    except Exception as exc:
        if is_unreachable(exc):
            raise unavailable(
                f"the gallery's pgvector table {source.table!r} is unreachable; retry shortly",
                RETRY_AFTER_S,
            ) from exc
        if _changed(exc):
            raise conflict(
                f"the gallery's pgvector table {source.table!r} changed under the service "
                f"({exc.__class__.__name__}: {str(exc).splitlines()[0]}); attach it again as "
                "recorded, or as a new gallery"
            ) from exc
        if isinstance(exc, psycopg.Error):
            # Any other answer of the database (out of memory, a statement timeout…): the
            # dependency failed, retry later; nothing was written.
            raise unavailable(
                f"the database of the gallery's pgvector table {source.table!r} failed: "
                f"{exc.__class__.__name__}; retry shortly",
                RETRY_AFTER_S,
            ) from exc
        raise


def describe(settings: Settings, source: PgvectorSource) -> TableShape:
    """Check the table can serve as a cosine gallery; 422 naming the field otherwise (the
    server out of reach: 422 on ``source.dsn``)."""
    check_names(source)
    try:
        with connected(settings, source) as conn:
            return _shape(conn, source)
    except Problem as exc:
        if exc.status == 503:
            raise invalid("source.dsn", f"the database is unreachable: {exc.detail}") from exc
        if exc.status == 409:
            raise invalid("source.table", exc.detail) from exc
        raise


def _column_types(conn: psycopg.Connection, source: PgvectorSource) -> dict[str, tuple[str, int]]:
    """Column name → (type name, type modifier) of the table; 422 when there is no such table."""
    schema, name = source.schema_table
    rows = conn.execute(
        "SELECT a.attname, t.typname, a.atttypmod FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p', 'v', 'm') "
        "AND a.attnum > 0 AND NOT a.attisdropped",
        (schema, name),
    ).fetchall()
    if not rows:
        raise invalid("source.table", f"no table {source.table!r} in this database")
    return {column: (typname, int(typmod)) for column, typname, typmod in rows}


def _unique(conn: psycopg.Connection, source: PgvectorSource) -> bool:
    """Whether the id column alone is the primary key or carries a unique index."""
    schema, name = source.schema_table
    return bool(
        conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
            "WHERE n.nspname = %s AND c.relname = %s AND i.indisunique AND i.indnatts = 1 "
            "AND i.indpred IS NULL AND a.attname = %s)",
            (schema, name, source.id_column),
        ).fetchone()[0]  # type: ignore[index]
    )


def _shape(conn: psycopg.Connection, source: PgvectorSource) -> TableShape:
    columns = _column_types(conn, source)
    id_type = columns.get(source.id_column, ("", 0))[0]
    if id_type not in INTEGER_TYPES + TEXT_TYPES:
        raise invalid(
            "source.id_column",
            f"{source.id_column!r}: an integer or text column of the table (found "
            f"{id_type or 'no such column'})",
        )
    if not _unique(conn, source):
        raise invalid(
            "source.id_column",
            f"{source.id_column!r}: ids must name one row each: the primary key or a column "
            "with a unique index of its own",
        )
    column_type, dim = columns.get(source.vector_column, ("", -1))
    if column_type not in COLUMN_TYPES:
        raise invalid(
            "source.vector_column",
            f"{source.vector_column!r}: a vector(D) or halfvec(D) column (found "
            f"{column_type or 'no such column'})",
        )
    if dim < 1:
        raise invalid(
            "source.vector_column",
            f"{source.vector_column!r} declares no dimension: the gallery needs one "
            f"({column_type}(D))",
        )
    if source.text_field is not None and columns.get(source.text_field, ("",))[0] not in (
        TEXT_TYPES
    ):
        raise invalid("source.text_field", f"{source.text_field!r}: a text column of the table")
    table, column = source.table_sql(), sql.Identifier(source.vector_column)
    # Rows without a vector are no items of the gallery (no search finds them).
    count = int(
        conn.execute(sql.SQL("SELECT count({}) FROM {}").format(column, table)).fetchone()[0]  # type: ignore[index]
    )
    if source.distance != "cosine":
        off_unit = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {} WHERE {} IS NOT NULL AND abs(vector_norm({}::vector) - 1) > %s"
            ).format(table, column, column),
            (UNIT_TOLERANCE,),
        ).fetchone()[0]  # type: ignore[index]
        if off_unit:
            raise invalid(
                "source.distance",
                f"{off_unit} rows are not unit length, so {source.distance} does not rank as "
                "cosine, the attached galleries' metric: normalise the rows, or upload them as a "
                "gallery of their own",
            )
    if source.search == "hnsw":
        _check_hnsw_index(conn, source, column_type)
    version = conn.execute(
        "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
    ).fetchone()
    return TableShape(
        dim=dim,
        count=count,
        id_type="int" if id_type in INTEGER_TYPES else "text",
        column_type=column_type,
        pgvector_version=None if version is None else str(version[0]),
    )


def hnsw_opclasses(conn: psycopg.Connection, source: PgvectorSource) -> list[str]:
    """The operator classes of the table's HNSW indexes on the vector column alone (no
    predicate: a partial index answers for some rows only)."""
    schema, name = source.schema_table
    rows = conn.execute(
        "SELECT opc.opcname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid "
        "JOIN pg_am am ON am.oid = ic.relam JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
        "JOIN pg_opclass opc ON opc.oid = i.indclass[0] "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND am.amname = 'hnsw' "
        "AND i.indnatts = 1 AND i.indpred IS NULL AND i.indisvalid",
        (schema, name, source.vector_column),
    ).fetchall()
    return [str(row[0]) for row in rows]


def _check_hnsw_index(conn: psycopg.Connection, source: PgvectorSource, column_type: str) -> None:
    """422 on ``source.search`` unless an HNSW index orders the vector column by ``distance``'s
    operator: without one the planner would scan the whole table on every search."""
    wanted = column_type + OPCLASS_SUFFIXES[source.distance]
    found = hnsw_opclasses(conn, source)
    if wanted not in found:
        raise invalid(
            "source.search",
            f"'hnsw' searches through an HNSW index on {source.vector_column!r} with operator "
            f"class {wanted} (the one of distance {source.distance!r}); found "
            f"{', '.join(found) or 'none'}: create it (CREATE INDEX ON {source.table} USING hnsw "
            f"({source.vector_column} {wanted})), or attach with search 'exact'",
        )
