"""One Alembic chain for SQLite and PostgreSQL: upgrade, match the models, downgrade."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text

from app.core.db import alembic_config
from app.db_models import Base
from tests.service.conftest import (
    create_postgres_database,
    drop_postgres_database,
    require_postgres,
)


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrate.db'}"
        return
    require_postgres()
    url = create_postgres_database()
    yield url
    drop_postgres_database(url)


def test_upgrade_matches_models_then_downgrade_empties(fresh_url: str) -> None:
    config = alembic_config(fresh_url)
    command.upgrade(config, "head")
    engine = create_engine(fresh_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
            assert diff == [], diff
            tables = set(inspect(connection).get_table_names())
        assert set(Base.metadata.tables) <= tables
        command.downgrade(config, "base")
        with engine.connect() as connection:
            assert set(inspect(connection).get_table_names()) <= {"alembic_version"}
        # And back up again: the chain is repeatable.
        command.upgrade(config, "head")
    finally:
        engine.dispose()


def upgraded_with_a_tenant(url: str, revision: str) -> tuple[Config, Engine, datetime]:
    """The schema at ``revision`` holding one tenant ``t``, for rows an older revision's data
    hangs from; the caller disposes of the engine."""
    config = alembic_config(url)
    command.upgrade(config, revision)
    engine = create_engine(url)
    now = datetime.now(UTC)
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', :now)"),
            {"now": now},
        )
    return config, engine, now


def test_0002_keeps_existing_datasets_with_an_empty_query_log(fresh_url: str) -> None:
    """Datasets made before query logs existed get zero counts; downgrading keeps them."""
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0001")
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO datasets (id, tenant_id, name, modalities, dims, count, "
                    "created_at) VALUES ('ds_1', 't', 'old', :modalities, '{}', 0, :now)"
                ),
                {"now": now, "modalities": '["default"]'},
            )
        command.upgrade(config, "0002")
        with engine.connect() as connection:
            row = connection.execute(
                text(
                    "SELECT query_count, queries_with_old_vectors, queries_with_relevance "
                    "FROM datasets WHERE id = 'ds_1'"
                )
            ).one()
            assert tuple(row) == (0, 0, 0)
            assert "dataset_queries" in inspect(connection).get_table_names()
        command.downgrade(config, "0001")
        with engine.connect() as connection:
            assert "dataset_queries" not in inspect(connection).get_table_names()
            columns = {c["name"] for c in inspect(connection).get_columns("datasets")}
            assert "query_count" not in columns
            ids = connection.execute(text("SELECT id FROM datasets")).scalars().all()
            assert ids == ["ds_1"]
    finally:
        engine.dispose()
