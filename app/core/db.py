"""Database: declarative base, engine factory (never at import time), sessions, migrations."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
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


def make_engine(url: str, settings: Settings) -> Engine:
    """Engine for ``url``; SQLite gets foreign keys, WAL and a busy timeout on every connection."""
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
    connect_args = {"options": options} if url.startswith("postgresql") else {}
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_overflow,
        pool_timeout=settings.db_pool_timeout_s,
        connect_args=connect_args,
    )


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


def migrate(url: str, revision: str = "head") -> None:
    """``alembic upgrade <revision>`` against ``url`` (the API runs it at start when configured)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)
