"""Revision 0008 on SQLite and PostgreSQL: galleries get a ``source`` (NULL for every gallery
made before it), attached galleries an id map that goes with them; downgrading refuses while a
gallery is attached and otherwise drops both and nothing else."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect, text

from tests.service.test_migrations import (  # noqa: F401  (fresh_url: the fixture)
    fresh_url,
    upgraded_with_a_tenant,
)

GALLERY = (
    "INSERT INTO galleries (id, tenant_id, name, dim, lift_curv, index_kind, index_params, "
    "count, index_version, vector_storage, created_at, updated_at) "
    "VALUES (:id, 't', :id, 4, 1.0, 'flat', '{}', 0, 0, :storage, :now, :now)"
)


def test_source_column_and_id_map_come_and_go(fresh_url: str) -> None:  # noqa: F811
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0007")
    try:
        with engine.begin() as connection:
            connection.execute(text(GALLERY), {"id": "gal_old", "storage": "segments", "now": now})
        command.upgrade(config, "0008")
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.execute(text("PRAGMA foreign_keys=ON"))
            source = connection.execute(text("SELECT source FROM galleries")).scalar()
            assert source is None
            connection.execute(text(GALLERY), {"id": "gal_q", "storage": "qdrant", "now": now})
            connection.execute(
                text("UPDATE galleries SET source = :s WHERE id = 'gal_q'"),
                {"s": '{"engine": "qdrant", "collection": "c", "path": "p"}'},
            )
            insert = text(
                "INSERT INTO attached_point_ids (gallery_id, vector_id, point_id) "
                "VALUES ('gal_q', :v, :p)"
            )
            connection.execute(
                insert, {"v": 2**62 + 3, "p": "8f1a0c3e-0000-4000-8000-000000000001"}
            )
        with pytest.raises(Exception, match=r"attached Qdrant"):
            command.downgrade(config, "0007")
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.execute(text("PRAGMA foreign_keys=ON"))
            vector_id = connection.execute(
                text("SELECT vector_id FROM attached_point_ids")
            ).scalar()
            assert vector_id == 2**62 + 3  # int64, not truncated
            connection.execute(text("DELETE FROM galleries WHERE id = 'gal_q'"))
            left = connection.execute(text("SELECT count(*) FROM attached_point_ids")).scalar()
            assert left == 0
        command.downgrade(config, "0007")
        with engine.connect() as connection:
            assert "attached_point_ids" not in inspect(connection).get_table_names()
            columns = {c["name"] for c in inspect(connection).get_columns("galleries")}
            assert "source" not in columns
            galleries = connection.execute(text("SELECT id FROM galleries")).scalars().all()
            assert galleries == ["gal_old"]
        command.upgrade(config, "head")
    finally:
        engine.dispose()
