"""Which databases a tenant's pgvector ``dsn`` may reach (``source_rules.dsn_place`` /
``dsn_allowed``, ``app.vectors.pgvector.source.allowed_dsn``): pure rules, no server."""

from __future__ import annotations

import pytest

from app.core.errors import Problem
from app.core.settings import Settings
from app.vectors.pgvector.source import PgvectorSource, allowed_dsn, check_names
from app.vectors.source_rules import dsn_allowed, dsn_place, owner_key, server_collection

ENTRY = "postgresql://db.internal:5432/catalog"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://reader@db.internal:5432/catalog",
        "postgresql://reader@DB.Internal/catalog",  # default port, host in another case
        "host=db.internal dbname=catalog user=reader sslmode=require",
        "host=db.internal port=5432 dbname=catalog",
    ],
)
def test_spellings_of_an_allowed_database_match_it(dsn: str) -> None:
    assert dsn_place(dsn) == "postgresql://db.internal:5432/catalog"
    assert dsn_allowed([ENTRY], dsn)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://reader@db.internal:5433/catalog",  # another port
        "postgresql://reader@db.internal:5432/other",  # another database
        "postgresql://reader@db.internal.evil:5432/catalog",  # another host
        "host=db.internal,evil dbname=catalog",  # several hosts
        "host=db.internal dbname=catalog hostaddr=10.0.0.9",  # connects elsewhere
        "host=db.internal dbname=catalog passfile=/etc/shadow",  # reads a file
        "host=db.internal dbname=catalog options='-c search_path=x'",
        "host=db.internal",  # no database
        "dbname=catalog",  # libpq's default socket
        "not a dsn",
    ],
)
def test_anything_else_matches_no_entry(dsn: str) -> None:
    assert not dsn_allowed([ENTRY], dsn)


def test_a_socket_folder_is_a_place_of_its_own() -> None:
    entry = "host=/run/pg port=5432 dbname=catalog"
    assert dsn_allowed([entry], "postgresql:///catalog?host=/run/pg")
    assert dsn_allowed([entry], "host=/run/x/../pg dbname=catalog")
    assert not dsn_allowed([entry], "host=/run/pg2 dbname=catalog")
    assert not dsn_allowed([entry], "host=/run/pg port=5433 dbname=catalog")


def test_one_table_has_one_owner_key_whatever_the_spelling() -> None:
    source = {"engine": "pgvector", "table": "public.items"}
    a = server_collection({**source, "dsn": "postgresql://u@DB:5432/catalog"})
    b = server_collection({**source, "dsn": "host=db dbname=catalog user=v"})
    assert a is not None and a == b
    assert owner_key(*a) != owner_key("pgvector", a[1], "public.other")


def test_allowed_dsn_refuses_with_the_setting_to_set_and_never_a_password() -> None:
    closed = Settings(pgvector_allowed_dsns=[])
    with pytest.raises(Problem) as refused:
        allowed_dsn(closed, "host=db.internal dbname=catalog")
    assert refused.value.status == 422
    assert "NOBACKFILL_PGVECTOR_ALLOWED_DSNS" in refused.value.detail
    opened = Settings(pgvector_allowed_dsns=f"{ENTRY},host=/run/pg dbname=x")  # type: ignore[arg-type]
    assert allowed_dsn(opened, "host=/run/pg dbname=x")["host"] == "/run/pg"
    with pytest.raises(Problem) as password:
        allowed_dsn(opened, "postgresql://u:secret@db.internal/catalog")
    assert "password_env" in password.value.detail


def test_the_services_own_database_is_never_attachable() -> None:
    own = "postgresql+psycopg://svc@db.internal:5432/catalog"
    settings = Settings(database_url=own, pgvector_allowed_dsns=[ENTRY])
    with pytest.raises(Problem) as refused:
        allowed_dsn(settings, "postgresql://reader@db.internal/catalog")
    assert "own database" in refused.value.detail


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"table": 'items"; DROP TABLE x; --'}, "source.table"),
        ({"table": "a.b.c"}, "source.table"),
        ({"id_column": "id name"}, "source.id_column"),
        ({"vector_column": "1embedding"}, "source.vector_column"),
        ({"text_field": "body;"}, "source.text_field"),
        ({"distance": "hamming"}, "source.distance"),
    ],
)
def test_names_that_are_not_plain_postgresql_names_are_refused(change: dict, field: str) -> None:
    source = {
        "dsn": ENTRY,
        "table": "public.items",
        "id_column": "id",
        "vector_column": "embedding",
    }
    check_names(PgvectorSource.of(source))  # the plain one passes
    with pytest.raises(Problem) as refused:
        check_names(PgvectorSource.of({**source, **change}))
    assert refused.value.errors[0].field == field
