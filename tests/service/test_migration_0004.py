"""Revision 0004 on SQLite and PostgreSQL: galleries that existed keep their SQL rows (marked
``sql``), re-embedded features no longer need a gallery_vectors row, and downgrading refuses
while a gallery keeps vectors in segment files."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect, text

from tests.service.test_migrations import (  # noqa: F401  (fresh_url: the fixture)
    fresh_url,
    upgraded_with_a_tenant,
)


def test_existing_galleries_keep_their_rows_and_downgrade_guards(fresh_url: str) -> None:  # noqa: F811
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0003")
    try:
        with engine.begin() as connection:
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
