"""Revision 0006 on SQLite and PostgreSQL: access counts get a table of their own; galleries made
before it have none (the plan then ranks by the learned gain alone), counts add up in SQL, go
with their gallery, and downgrading drops them and nothing else."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from tests.service.test_migrations import (  # noqa: F401  (fresh_url: the fixture)
    fresh_url,
    upgraded_with_a_tenant,
)


def test_access_counts_table_comes_and_goes(fresh_url: str) -> None:  # noqa: F811
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0005")
    gallery = (
        "INSERT INTO galleries (id, tenant_id, name, dim, lift_curv, index_kind, index_params, "
        "count, index_version, vector_storage, created_at, updated_at) "
        "VALUES (:id, 't', :id, 4, 1.0, 'flat', '{}', 0, 0, 'segments', :now, :now)"
    )
    try:
        with engine.begin() as connection:
            connection.execute(text(gallery), {"id": "gal_old", "now": now})
        command.upgrade(config, "0006")
        upsert = text(
            "INSERT INTO gallery_access (gallery_id, item_id, vector_id, count) "
            "VALUES (:g, :i, :v, :c) ON CONFLICT (gallery_id, item_id) "
            "DO UPDATE SET count = gallery_access.count + excluded.count"
        )
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.execute(text("PRAGMA foreign_keys=ON"))
            assert connection.execute(text("SELECT count(*) FROM gallery_access")).scalar() == 0
            connection.execute(text(gallery), {"id": "gal_new", "now": now})
            for g, c in (("gal_old", 3), ("gal_old", 2**40), ("gal_new", 1)):
                connection.execute(upsert, {"g": g, "i": "a", "v": 0, "c": c})
            rows = connection.execute(
                text("SELECT gallery_id, count FROM gallery_access ORDER BY gallery_id")
            ).all()
            assert [tuple(r) for r in rows] == [("gal_new", 1), ("gal_old", 2**40 + 3)]
            connection.execute(text("DELETE FROM galleries WHERE id = 'gal_new'"))
            left = connection.execute(text("SELECT gallery_id FROM gallery_access")).scalars()
            assert list(left) == ["gal_old"]
        command.downgrade(config, "0005")
        with engine.connect() as connection:
            assert "gallery_access" not in inspect(connection).get_table_names()
            galleries = connection.execute(text("SELECT id FROM galleries")).scalars().all()
            assert galleries == ["gal_old"]
        command.upgrade(config, "head")
    finally:
        engine.dispose()
