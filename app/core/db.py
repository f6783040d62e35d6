"""Database: declarative base, engine factory (never at import time), sessions, migrations."""

from __future__ import annotations

import inspect
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Engine,
    Integer,
    MetaData,
    TypeDecorator,
    create_engine,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from app.core.settings import Settings

log = logging.getLogger(__name__)

# Constraint names fixed by convention so that Alembic batch mode can find them on SQLite.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only turns an INTEGER PRIMARY KEY into an auto-incrementing rowid.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


def as_utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC); PostgreSQL aware ones."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on the way in and out (SQLite stores and returns naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        datetime: UTCDateTime(),
    }


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """Time-ordered opaque id: ``<prefix>_<ms since epoch, hex><80 random bits>``; sorting by id
    sorts by creation, which is what cursor pagination walks."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(10)}"


def _sqlite_pragmas(busy_timeout_ms: int):
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # FULL: a commit is on disk before it returns, so an acknowledged write survives even a
        # power loss (NORMAL in WAL mode survives a killed process but may lose the last commits).
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    return on_connect


# TCP keepalives on PostgreSQL connections: a peer that vanished (a partition, a dead host whose
# packets are dropped) is noticed within idle + interval × count = 30 s even on an idle pooled
# connection, and data left unacknowledged for TCP_USER_TIMEOUT_MS ends the connection. Neither
# helps against a server whose kernel still acknowledges but which never answers (a wedged
# PostgreSQL): that is the read timeout's work (``_bounded_connection``).
PG_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 15,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


class _Waits:
    """Per-thread override of the read timeout (the pool's pre-ping gets a shorter one)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def limit(self, default: float | None) -> float | None:
        return getattr(self.local, "limit", default)

    @contextmanager
    def bounded(self, limit_s: float) -> Iterator[None]:
        previous = getattr(self.local, "limit", None)
        self.local.limit = limit_s
        try:
            yield
        finally:
            if previous is None:
                del self.local.limit
            else:
                self.local.limit = previous


def _bounded_connection(read_timeout_s: float | None, waits: _Waits) -> type:
    """A psycopg ``Connection`` whose every wait for the server (a statement, a fetch, a commit)
    ends after ``read_timeout_s`` (or the thread's shorter bound, see ``_Waits``): the
    connection is then closed and ``OperationalError`` raised, which SQLAlchemy reads as a
    disconnect (the connection is invalidated, the request answers 503). ``statement_timeout``
    is the server's to enforce and does nothing when the server itself does not answer."""
    import psycopg

    class BoundedConnection(psycopg.Connection):
        def wait(self, gen: Any, interval: float | None = None, timeout: float | None = None):
            limit = timeout if timeout is not None else waits.limit(read_timeout_s)
            kwargs: dict[str, Any] = {} if interval is None else {"interval": interval}
            started = time.monotonic()
            try:
                return super().wait(gen, timeout=limit, **kwargs)
            except psycopg.OperationalError as exc:
                waited = time.monotonic() - started
                if timeout is not None or limit is None or waited < limit:
                    raise
                # A statement may still be running (or the server hung mid-answer): the
                # connection cannot be reused. close() sends no more than a Terminate message.
                self.close()
                raise psycopg.OperationalError(
                    f"the database server did not answer within {limit:g} s; connection closed"
                ) from exc

    return BoundedConnection


def _postgres_bounds(engine: Engine, settings: Settings) -> None:
    """Connect through ``BoundedConnection`` and bound the pool's pre-ping by
    ``db_ping_timeout_s``: a wedged server turns a checkout into a 503 within seconds."""
    import psycopg

    parameters = inspect.signature(psycopg.Connection.wait).parameters
    if not {"interval", "timeout"} <= set(parameters):
        # psycopg before 3.2 has no bounded wait: connect_timeout and keepalives still hold.
        log.warning("psycopg %s: no client-side read timeout on PostgreSQL", psycopg.__version__)
        return
    waits = _Waits()
    read_timeout = settings.db_read_timeout_s or None
    connection_class = _bounded_connection(read_timeout, waits)

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        return connection_class.connect(*cargs, **cparams)

    ping: Callable[[Any], bool] = engine.dialect.do_ping

    def bounded_ping(dbapi_connection: Any) -> bool:
        with waits.bounded(settings.db_ping_timeout_s):
            return ping(dbapi_connection)

    engine.dialect.do_ping = bounded_ping  # type: ignore[method-assign]


def make_engine(url: str, settings: Settings) -> Engine:
    """Engine for ``url``; SQLite gets foreign keys, WAL and a busy timeout on every connection;
    PostgreSQL connect, read, ping and server-side statement timeouts."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas(settings.sqlite_busy_timeout_ms))
        return engine
    # Server-side limits, so that no request, however stalled, holds a connection, a transaction
    # or its row locks for long (the pool's own wait is bounded too: past it, a 503).
    options = (
        f"-c statement_timeout={int(settings.pg_statement_timeout_ms)} "
        f"-c idle_in_transaction_session_timeout={int(settings.pg_idle_in_transaction_timeout_ms)}"
    )
    postgres = url.startswith("postgresql")
    connect_args: dict[str, Any] = {}
    if postgres:
        # connect_timeout: libpq's bound on establishing a connection (a server that accepts
        # the TCP connection and never answers the startup packet fails it, no hang).
        connect_args = {
            "options": options,
            "connect_timeout": int(settings.db_connect_timeout_s),
            **PG_KEEPALIVES,
        }
    engine = create_engine(
        url,
        pool_pre_ping=True,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_overflow,
        pool_timeout=settings.db_pool_timeout_s,
        connect_args=connect_args,
    )
    if postgres and engine.dialect.driver == "psycopg":
        _postgres_bounds(engine, settings)
    return engine


class Database:
    """An engine and its session factory, built from settings (in the lifespan or a worker)."""

    def __init__(self, settings: Settings, url: str | None = None) -> None:
        # Every mapped class must be known before the first flush resolves foreign keys: the
        # entry points (app.main, app.cli, worker.tasks) import the registry, app.db_models.
        self.url = url or settings.resolved_database_url
        self.engine = make_engine(self.url, settings)
        # Sessions carry the settings: storage outside the database (vector segment files under
        # the data dir) is found through the session that commits it.
        self.sessions = sessionmaker(
            self.engine, expire_on_commit=False, info={"settings": settings}
        )

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error."""
        with self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()


def migrations_dir() -> Path:
    """The Alembic scripts, found as the ``migrations`` package: an installed copy (the image's
    non-editable ``pip install .``) has them in site-packages beside ``app``, where no source tree
    or ``alembic.ini`` exists."""
    import migrations

    return Path(next(iter(migrations.__path__))).resolve()


def alembic_config(url: str):
    """An Alembic configuration built in code (``alembic.ini`` serves only the ``alembic`` command
    line in a checkout)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("path_separator", "os")
    config.attributes["database_url"] = url
    return config


class MigrationTimeout(RuntimeError):
    """A migration gave up waiting: a lock held by another session, or a statement past its
    limit. On PostgreSQL the migrations run in one transaction, rolled back whole."""


# SQLSTATEs of a wait cut short: lock_not_available (lock_timeout), query_canceled
# (statement_timeout).
_MIGRATION_TIMEOUTS = {"55P03": "lock_timeout", "57014": "statement_timeout"}


def migration_connect_args(url: str, settings: Settings) -> dict[str, Any]:
    """The migration connection's bounds on PostgreSQL: its own lock and statement timeouts
    (not the requests': a migration may rewrite a large table), and the requests' connect
    timeout and keepalives."""
    if not url.startswith("postgresql"):
        return {}
    return {
        "options": f"-c lock_timeout={int(settings.migration_lock_timeout_ms)} "
        f"-c statement_timeout={int(settings.migration_statement_timeout_ms)}",
        "connect_timeout": int(settings.db_connect_timeout_s),
        **PG_KEEPALIVES,
    }


def migrate(url: str, revision: str = "head", settings: Settings | None = None) -> None:
    """``alembic upgrade <revision>`` against ``url`` (the API runs it at start when configured).
    Raises ``MigrationTimeout`` (logged, with the setting to change) when it waited too long."""
    from alembic import command
    from sqlalchemy.exc import OperationalError

    from app.core.settings import get_settings

    settings = settings or get_settings()
    config = alembic_config(url)
    config.attributes["connect_args"] = migration_connect_args(url, settings)
    try:
        command.upgrade(config, revision)
    except OperationalError as exc:
        limit = _MIGRATION_TIMEOUTS.get(getattr(exc.orig, "sqlstate", None) or "")
        if limit is None:
            raise
        setting = {
            "lock_timeout": f"NOBACKFILL_MIGRATION_LOCK_TIMEOUT_MS={settings.migration_lock_timeout_ms}",
            "statement_timeout": "NOBACKFILL_MIGRATION_STATEMENT_TIMEOUT_MS="
            f"{settings.migration_statement_timeout_ms}",
        }[limit]
        message = (
            f"database migration to {revision} stopped by PostgreSQL's {limit} ({setting}): "
            "another session holds a lock on a table it changes, or a statement ran too long; "
            "nothing was changed. End that session (pg_stat_activity, pg_locks) or raise the "
            f"limit, then start again. Server said: {str(exc.orig).strip().splitlines()[0]}"
        )
        log.error("%s", message)
        raise MigrationTimeout(message) from exc
