"""One Alembic chain for SQLite and PostgreSQL: upgrade, match the models, downgrade."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app.core.all_models import Base
from app.core.db import alembic_config
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
