"""Revision 0007 on SQLite and PostgreSQL: the search-returned tally gets a table of its own;
galleries made before it have none, weights add up in SQL, go with their gallery, and
downgrading drops them and nothing else."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from tests.service.test_migrations import (  # noqa: F401  (fresh_url: the fixture)
    fresh_url,
    upgraded_with_a_tenant,
)


def test_returned_tally_table_comes_and_goes(fresh_url: str) -> None:  # noqa: F811
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0006")
    gallery = (
        "INSERT INTO galleries (id, tenant_id, name, dim, lift_curv, index_kind, index_params, "
        "count, index_version, vector_storage, created_at, updated_at) "
        "VALUES (:id, 't', :id, 4, 1.0, 'flat', '{}', 0, 0, 'segments', :now, :now)"
    )
    try:
        with engine.begin() as connection:
            connection.execute(text(gallery), {"id": "gal_old", "now": now})
        command.upgrade(config, "0007")
        upsert = text(
            "INSERT INTO gallery_returned (gallery_id, vector_id, weight) "
            "VALUES (:g, :v, :w) ON CONFLICT (gallery_id, vector_id) "
            "DO UPDATE SET weight = gallery_returned.weight + excluded.weight"
        )
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.execute(text("PRAGMA foreign_keys=ON"))
            assert connection.execute(text("SELECT count(*) FROM gallery_returned")).scalar() == 0
            connection.execute(text(gallery), {"id": "gal_new", "now": now})
            for g, w in (("gal_old", 1.0), ("gal_old", 0.25), ("gal_new", 0.5)):
                connection.execute(upsert, {"g": g, "v": 7, "w": w})
            rows = connection.execute(
                text("SELECT gallery_id, weight FROM gallery_returned ORDER BY gallery_id")
            ).all()
            assert [tuple(r) for r in rows] == [("gal_new", 0.5), ("gal_old", 1.25)]
            connection.execute(text("DELETE FROM galleries WHERE id = 'gal_new'"))
            left = connection.execute(text("SELECT gallery_id FROM gallery_returned")).scalars()
            assert list(left) == ["gal_old"]
        command.downgrade(config, "0006")
        with engine.connect() as connection:
            assert "gallery_returned" not in inspect(connection).get_table_names()
            galleries = connection.execute(text("SELECT id FROM galleries")).scalars().all()
            assert galleries == ["gal_old"]
        command.upgrade(config, "head")
    finally:
        engine.dispose()
