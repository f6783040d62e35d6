"""Revision 0004 on SQLite and PostgreSQL: galleries that existed keep their SQL rows (marked
``sql``), re-embedded features no longer need a gallery_vectors row, and downgrading refuses
while a gallery keeps vectors in segment files."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text

from app.core.db import alembic_config
from tests.service.test_migrations import fresh_url  # noqa: F401  (the fixture)


def test_existing_galleries_keep_their_rows_and_downgrade_guards(fresh_url: str) -> None:  # noqa: F811
    config = alembic_config(fresh_url)
    command.upgrade(config, "0003")
    engine = create_engine(fresh_url)
    now = datetime.now(UTC)
    try:
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', :now)"),
                {"now": now},
            )
            connection.execute(
                text(
                    "INSERT INTO galleries (id, tenant_id, name, dim, lift_curv, index_kind, "
                    "index_params, count, index_version, created_at, updated_at) VALUES "
                    "('gal_1', 't', 'old', 2, 1.0, 'flat', '{}', 1, 1, :now, :now)"
                ),
                {"now": now},
            )
            connection.execute(
                text(
                    "INSERT INTO gallery_vectors (gallery_id, item_id, vector, updated_at) "
                    "VALUES ('gal_1', 'a', :vector, :now)"
                ),
                {"now": now, "vector": b"\0" * 8},
            )
        command.upgrade(config, "head")
        with engine.connect() as connection:
            row = connection.execute(
                text("SELECT vector_storage, vector_manifest FROM galleries WHERE id = 'gal_1'")
            ).one()
            assert tuple(row) == ("sql", None)
            assert connection.execute(text("SELECT count(*) FROM gallery_vectors")).scalar() == 1
            keys = inspect(connection).get_foreign_keys("gallery_reembedded")
            assert {k["referred_table"] for k in keys} == {"galleries", "models"}
        command.downgrade(config, "0003")
        command.upgrade(config, "head")
        with engine.begin() as connection:
            connection.execute(text("UPDATE galleries SET vector_storage = 'segments'"))
        with pytest.raises(RuntimeError, match="segment files"):
            command.downgrade(config, "0003")
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM galleries")).scalar() == 1
    finally:
        engine.dispose()
