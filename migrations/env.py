"""Alembic environment: ``Base.metadata`` from the app, the URL from the service settings (or
from ``config.attributes['database_url']`` when the app migrates programmatically)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from app.core.db import migration_connect_args
from app.core.settings import get_settings
from app.db_models import Base

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    return config.attributes.get("database_url") or get_settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = database_url()
    if url.startswith("sqlite"):
        from pathlib import Path

        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    # The migration connection's lock and statement timeouts: passed by app.core.db.migrate,
    # or (the `alembic` command line) read from the settings.
    connect_args = config.attributes.get("connect_args")
    if connect_args is None:
        connect_args = migration_connect_args(url, get_settings())
    engine = create_engine(url, poolclass=pool.NullPool, connect_args=connect_args)
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
