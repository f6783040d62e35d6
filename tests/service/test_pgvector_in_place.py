"""Migrating an attached pgvector table in place (issue 46, item 2), against a real PostgreSQL 18
with pgvector 0.8 (``tests/service/pgvector_server.py``).

attach → upgrade (procrustes, query objective) → plan → re-embedded items uploaded: they go into
a column ``nobackfill_<model id>`` of type ``vector(768)`` the service adds to the owner's table
(nullable, no default: no rewrite, the table's file node stays the same), its provenance in the
column's comment; the owner's vector column is never written. Transition and mixed searches run
two exact searches of the table (the new column; the old column among the rows without it) and
merge them with the service's merge: the same top-10 as the same flow on a copied gallery. With
nothing re-embedded a transition search is the old model's search (stay), with everything
re-embedded the new model's (reindex). Deleting the model or the gallery with ``?cascade=true``
drops exactly the column (and index) the service added.

Real vectors (tests/fixtures/wordnet_small.npz): row i of the table is synset i's gloss, its id i.
Both SQL backends for the migration itself, SQLite for the rest (``sqlite_only``: no SQL path of
their own); FAISS only, as tests/service/test_pgvector_attach.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.vectors.pgvector import migration as pg_migration
from app.vectors.pgvector.source import PgvectorSource
from app.vectors.tables import ReembeddedVector
from tests.service.conftest import problem, snapshot
from tests.service.pgvector_server import (  # noqa: F401  (the fixtures)
    PgvectorServer,
    pgvector_database_fixture,
    pgvector_server_fixture,
)
from tests.service.test_pgvector_attach import SOURCE, build_table, make_settings  # noqa: F401
from tests.service.test_qdrant_migrate import (
    attached_and_upgraded,
    hits,
    reembed,
    searches_match,
    transition,
)
from tests.service.test_queries_api import NEW, OLD
from tests.service.test_two_stage_search import (  # noqa: F401  (embedder: the fixture)
    TEXTS,
    calls,
    control,
    embedder,
    reembedded_rows,
    top_ids,
)

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")
ON_SQLITE = pytest.mark.sqlite_only("an in-place write's own checks; PostgreSQL: the migration")

N = 400  # rows in the table


@pytest.fixture
def source_extra(request: pytest.FixtureRequest) -> dict:
    """What the test adds to the attach's source (``migration_hnsw``, ``distance``)."""
    return getattr(request, "param", {})


@pytest.fixture
def migration(
    client: TestClient,
    pgvector_database: str,
    wordnet_small: dict,
    monkeypatch: pytest.MonkeyPatch,
    source_extra: dict,
) -> dict:
    """The table attached, the same vectors copied into a gallery, and a backbone model upgraded
    on the attached gallery (relevance maps forced on, as test_qdrant_migrate's)."""
    old = wordnet_small[f"gloss.{OLD}"][:N]
    build_table(pgvector_database, old)
    source = {**SOURCE, "dsn": pgvector_database, **source_extra}
    found = attached_and_upgraded(client, source, old, wordnet_small, monkeypatch)
    return found | {
        "dsn": pgvector_database,
        "column": f"nobackfill_{found['model_id']}",
        "source": source,
    }


def sql(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []


def owner_state(dsn: str) -> dict:
    """The owner's rows and vectors (every column but the service's), the table's file node,
    columns and indexes."""
    rows = sql(
        dsn,
        "SELECT md5(string_agg(doc_id || '|' || title || '|' || embedding::text, ',' "
        "ORDER BY doc_id)) FROM nouns",
    )
    return {
        "rows": rows[0][0],
        "filenode": sql(dsn, "SELECT pg_relation_filenode('nouns')")[0][0],
        "columns": columns(dsn),
        "indexes": indexes(dsn),
    }


def columns(dsn: str) -> dict[str, str]:
    """Column → its type as declared, of the table ``nouns``."""
    found = sql(
        dsn,
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'nouns'::regclass AND attnum > 0 AND NOT attisdropped",
    )
    return dict(found)


def indexes(dsn: str) -> dict[str, str]:
    return dict(sql(dsn, "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'nouns'"))


def new_column(dsn: str, column: str) -> dict[int, np.ndarray]:
    """Row id → its value of the service's column, for the rows that have one."""
    rows = sql(dsn, f'SELECT doc_id, "{column}"::real[] FROM nouns WHERE "{column}" IS NOT NULL')
    return {int(i): np.asarray(v, dtype=np.float32) for i, v in rows}


def plan(client: TestClient, migration: dict, **body) -> list[str]:
    planned = client.post(
        f"/v1/galleries/{migration['attached']}/backfill-plan",
        json={"model_id": migration["model_id"], **body},
    )
    assert planned.status_code == 200, planned.text
    return planned.json()["ids"]


def test_in_place_migration_writes_only_its_column_and_searches_like_the_copied_gallery(
    client: TestClient, migration: dict, wordnet_small: dict
) -> None:
    attached, copied, model_id = migration["attached"], migration["copied"], migration["model_id"]
    dsn, column = migration["dsn"], migration["column"]
    before = owner_state(dsn)
    planned = plan(client, migration, fraction=0.25)
    assert len(planned) == 100 == len(set(planned))

    stored = reembed(client, attached, model_id, wordnet_small, planned)
    assert stored.json() == {"upserted": 100, "count": N, "reembedded": 100}, stored.text
    assert reembed(client, copied, model_id, wordnet_small, planned).status_code == 200

    # The table: one more column, vector(768), on exactly the re-embedded rows with their
    # features, its provenance in its comment; the owner's rows, vectors and indexes as they
    # were, and no rewrite (the same file node).
    after = owner_state(dsn)
    assert after["columns"] == before["columns"] | {column: "vector(768)"}
    assert (after["rows"], after["filenode"]) == (before["rows"], before["filenode"])
    assert after["indexes"] == before["indexes"]  # no HNSW index unless asked
    written = new_column(dsn, column)
    assert set(written) == {int(i) for i in planned}
    for key, vector in written.items():
        expected = wordnet_small[f"gloss.{NEW}"][key].astype(np.float32)
        np.testing.assert_array_equal(vector, expected)
    comment = sql(
        dsn,
        "SELECT col_description(attrelid, attnum) FROM pg_attribute "
        "WHERE attrelid = 'nouns'::regclass AND attname = %s",
        (column,),
    )
    assert json.loads(comment[0][0]) == {"service": "nobackfill", "model_id": model_id, "dim": 768}
    # The service's own store keeps one row per item and no vector.
    with client.app.state.service.db.sessions() as session:
        kept = session.execute(
            select(func.count(), func.count(ReembeddedVector.features)).where(
                ReembeddedVector.gallery_id == attached
            )
        ).one()
    assert tuple(kept) == (100, 0)
    progress = client.get(f"/v1/galleries/{attached}").json()["reembedded"]
    assert [(p["reembedded"], p["total"]) for p in progress] == [(100, N)]
    assert not set(plan(client, migration, count=10)) & set(planned)

    # Transition and mixed searches: the copied gallery's answers, hit for hit.
    searches_match(client, migration, wordnet_small, planned)
    assert owner_state(dsn) == after


@ON_SQLITE
def test_transition_search_is_stay_at_none_and_reindex_at_all(
    client: TestClient, migration: dict, wordnet_small: dict
) -> None:
    """Nothing re-embedded: the old model's own search of the table (stay). Everything
    re-embedded: the new model's search of its column alone, as a gallery of the new vectors
    searched by the new features (reindex)."""
    attached, model_id = migration["attached"], migration["model_id"]
    rows = np.r_[0:16, 320:352]
    old_q = wordnet_small[f"lemma.{OLD}"][rows]
    new_q = wordnet_small[f"lemma.{NEW}"][rows]
    stay = client.post(
        f"/v1/galleries/{attached}/search", json={"vectors": old_q.tolist(), "k": 10}
    )
    at_none = hits(transition(client, attached, model_id, wordnet_small, rows))
    assert [[item for item, _ in row] for row in at_none] == [
        [h["id"] for h in row] for row in stay.json()["results"]
    ]
    assert {space for row in at_none for _, space in row} == {"old"}

    stored = reembed(client, attached, model_id, wordnet_small, migration["ids"])
    assert stored.json()["reembedded"] == N, stored.text
    reindexed = client.post(
        "/v1/galleries",
        json={"name": "reindexed", "model_name": NEW, "dim": 768, "metric": "cosine"},
    )
    assert reindexed.status_code == 201, reindexed.text
    url = f"/v1/galleries/{reindexed.json()['id']}"
    new = wordnet_small[f"gloss.{NEW}"][:N]
    uploaded = client.post(
        f"{url}/vectors", json={"ids": migration["ids"], "vectors": new.tolist()}
    )
    assert uploaded.status_code == 200, uploaded.text
    reindex = client.post(f"{url}/search", json={"vectors": new_q.tolist(), "k": 10})
    at_all = hits(transition(client, attached, model_id, wordnet_small, rows))
    assert [[item for item, _ in row] for row in at_all] == [
        [h["id"] for h in row] for row in reindex.json()["results"]
    ]
    assert {space for row in at_all for _, space in row} == {"new"}


@pytest.mark.parametrize(
    ("source_extra", "deleted"),
    [
        ({"migration_hnsw": True}, "model"),
        ({"migration_hnsw": True, "distance": "inner_product"}, "gallery"),
    ],
    indirect=["source_extra"],
)
@ON_SQLITE
def test_a_cascaded_delete_drops_exactly_the_added_column_and_index(
    client: TestClient, migration: dict, wordnet_small: dict, deleted: str
) -> None:
    """Asked for on attach (``migration_hnsw``): an HNSW index on the service's column, with the
    operator class of ``distance``. Deleting the model (or the gallery) with ``?cascade=true``
    drops the column and its index, and leaves the table as it was before the migration."""
    attached, model_id, dsn = migration["attached"], migration["model_id"], migration["dsn"]
    column = migration["column"]
    before = owner_state(dsn)
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][:40]).status_code
    added = set(indexes(dsn)) - set(before["indexes"])
    assert added == {f"{column}_hnsw"}
    ops = {"cosine": "vector_cosine_ops", "inner_product": "vector_ip_ops"}
    definition = indexes(dsn)[f"{column}_hnsw"]
    assert f"USING hnsw ({column} {ops[migration['source'].get('distance', 'cosine')]})" in (
        definition
    )
    if deleted == "model":
        client.delete(f"/v1/galleries/{migration['copied']}")
        gone = client.delete(f"/v1/models/{model_id}", params={"cascade": "true"})
    else:
        for dataset in client.get("/v1/datasets").json()["items"]:
            if dataset["gallery_id"] == attached:
                assert client.delete(f"/v1/datasets/{dataset['id']}").status_code == 204
        gone = client.delete(f"/v1/galleries/{attached}", params={"cascade": "true"})
    assert gone.status_code == 200, gone.text
    assert owner_state(dsn) == before


@ON_SQLITE
def test_the_operator_class_follows_the_distance_and_an_owner_column_is_left_alone(
    client: TestClient, pgvector_database: str, wordnet_small: dict
) -> None:
    """``ensure_column`` for each distance (unit rows: all three attach) indexes with pgvector's
    operator class of that distance; a column of the service's name that the service did not
    add is never altered nor dropped."""
    dsn = pgvector_database
    build_table(dsn, wordnet_small[f"gloss.{OLD}"][:20])
    settings = client.app.state.service.settings
    ops = {"cosine": "vector_cosine_ops", "inner_product": "vector_ip_ops", "l2": "vector_l2_ops"}
    for n, (distance, opclass) in enumerate(ops.items()):
        source = PgvectorSource.of({**SOURCE, "dsn": dsn, "distance": distance})
        source = PgvectorSource.of({**source.as_dict(), "migration_hnsw": True})
        model_id = f"mdl_{n}"
        pg_migration.ensure_column(settings, source, model_id, 8)
        assert (
            f"USING hnsw (nobackfill_mdl_{n} {opclass})" in indexes(dsn)[f"nobackfill_mdl_{n}_hnsw"]
        )
    # The owner's own column of that name: 409 on a write, kept by a delete.
    sql(dsn, "ALTER TABLE nouns ADD COLUMN nobackfill_mdl_9 vector(8)")
    source = PgvectorSource.of({**SOURCE, "dsn": dsn})
    with pytest.raises(Exception, match="not the service's to change"):
        pg_migration.ensure_column(settings, source, "mdl_9", 8)
    pg_migration.forget_models(settings, "g", source, ["mdl_9", "mdl_0"])
    assert "nobackfill_mdl_9" in columns(dsn) and "nobackfill_mdl_0" not in columns(dsn)


@ON_SQLITE
def test_a_row_deleted_after_the_plan_is_skipped_and_listed(
    client: TestClient, migration: dict, wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached, model_id, dsn = migration["attached"], migration["model_id"], migration["dsn"]
    planned = plan(client, migration, count=10)
    gone = planned[3]
    sql(dsn, "DELETE FROM nouns WHERE doc_id = %s", (int(gone),))
    stored = reembed(client, attached, model_id, wordnet_small, planned)
    assert stored.json() == {"upserted": 9, "count": N, "reembedded": 9, "skipped": [gone]}
    assert set(new_column(dsn, migration["column"])) == {int(i) for i in planned} - {int(gone)}

    # Deleted between the service's look-up and its write: the UPDATE does not find it.
    more = plan(client, migration, count=5)
    write = pg_migration.write

    def deleted_first(*args, **kwargs):
        sql(dsn, "DELETE FROM nouns WHERE doc_id = %s", (int(more[0]),))
        return write(*args, **kwargs)

    monkeypatch.setattr(pg_migration, "write", deleted_first)
    raced = reembed(client, attached, model_id, wordnet_small, more)
    assert raced.json() == {"upserted": 4, "count": N, "reembedded": 13, "skipped": [more[0]]}
    assert int(more[0]) not in new_column(dsn, migration["column"])

    # An id that can name no row at all is the caller's mistake, as on any gallery.
    before = snapshot(client)
    refused = problem(reembed(client, attached, model_id, wordnet_small, ["7", "x"]), 422)
    assert refused["errors"][0]["field"] == "ids[1]"
    assert snapshot(client) == before


@ON_SQLITE
def test_a_dropped_column_is_a_409_and_changes_nothing(
    client: TestClient, migration: dict, wordnet_small: dict
) -> None:
    attached, model_id, dsn = migration["attached"], migration["model_id"], migration["dsn"]
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][::2]).status_code
    before = snapshot(client)
    # The re-embedded column as a gallery of its own: half the rows, new space, no merge.
    alone = {**migration["source"], "vector_column": migration["column"]}
    refused = problem(client.post("/v1/galleries", json={"name": "new-only", "source": alone}), 422)
    assert refused["errors"][0]["field"] == "source.vector_column"
    assert "re-embedded" in refused["detail"]
    # The owner dropped the service's column: the old vectors alone would answer for items that
    # should be scored in the new space, unmerged. Refused, nothing written.
    sql(dsn, f'ALTER TABLE nouns DROP COLUMN "{migration["column"]}"')
    dropped = problem(transition(client, attached, model_id, wordnet_small), 409)
    assert migration["column"] in dropped["detail"]
    features = {"model_id": model_id, "features": wordnet_small[f"lemma.{NEW}"][:2].tolist()}
    problem(client.post(f"/v1/galleries/{attached}/search", json=features), 409)
    # The owner dropped the vector column itself.
    sql(dsn, "ALTER TABLE nouns DROP COLUMN embedding")
    changed = problem(reembed(client, attached, model_id, wordnet_small, ["1"]), 409)
    assert "changed under the service" in changed["detail"]
    assert snapshot(client) == before


@ON_SQLITE
def test_server_down_is_a_503_with_retry_after_and_writes_nothing(
    client: TestClient, migration: dict, wordnet_small: dict, pgvector_server: PgvectorServer
) -> None:
    attached, model_id, dsn = migration["attached"], migration["model_id"], migration["dsn"]
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][::4]).status_code
    answer = hits(transition(client, attached, model_id, wordnet_small))
    before, written = snapshot(client), new_column(dsn, migration["column"])
    pgvector_server.stop()
    try:
        for response in (
            transition(client, attached, model_id, wordnet_small),
            reembed(client, attached, model_id, wordnet_small, migration["ids"][1::4]),
        ):
            down = problem(response, 503)
            assert "unreachable" in down["detail"], down
            assert int(response.headers["Retry-After"]) > 0
        assert snapshot(client) == before
    finally:
        pgvector_server.start()
    assert new_column(dsn, migration["column"]).keys() == written.keys()
    assert hits(transition(client, attached, model_id, wordnet_small)) == answer


@ON_SQLITE
def test_two_stage_search_and_the_reembed_job_read_texts_and_write_in_place(
    make_client: Callable[..., TestClient],
    embedder: str,  # noqa: F811  (the imported fixture)
    pgvector_database: str,
    wordnet_small: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``text_field`` names a text column: a two-stage search embeds its candidates' texts and
    writes them into the model's column (the next search embeds nothing, the copied gallery's
    top 10); a re-embed job then fills the column with every row whose text is usable (a NULL
    and a blank text skipped)."""
    client = make_client(embedder_allowed_urls=[embedder], embedder_max_batch=1024)
    dsn, old = pgvector_database, wordnet_small[f"gloss.{OLD}"][:N]
    build_table(dsn, old)
    texts = [None if i == 5 else "" if i == 6 else TEXTS[i]["gloss"] for i in range(N)]
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("ALTER TABLE nouns ADD COLUMN gloss text")
        cur.executemany(
            "UPDATE nouns SET gloss = %s WHERE doc_id = %s", list(zip(texts, range(N), strict=True))
        )
    source = {**SOURCE, "dsn": dsn, "text_field": "gloss"}
    state = attached_and_upgraded(client, source, old, wordnet_small, monkeypatch)
    copied_texts = [t or None for t in texts]
    upload = client.post(
        f"/v1/galleries/{state['copied']}/vectors",
        json={"ids": state["ids"], "vectors": old.tolist(), "texts": copied_texts},
    )
    assert upload.status_code == 200, upload.text
    body = {"name": "mpnet", "url": embedder, "model": NEW, "dimension": 768, "max_batch": 1024}
    created = client.post("/v1/embedders", json=body)
    assert created.status_code == 201, created.text
    patched = client.patch(
        f"/v1/models/{state['model_id']}", json={"embedder_id": created.json()["id"]}
    )
    assert patched.status_code == 200, patched.text
    control(embedder, "ok")
    column = f"nobackfill_{state['model_id']}"
    rows = np.arange(40)
    query = {
        "model_id": state["model_id"],
        "features": wordnet_small[f"lemma.{NEW}"][rows].tolist(),
        "old_vectors": wordnet_small[f"lemma.{OLD}"][rows].tolist(),
        "k": 10,
        "rerank": {"depth": 20},
    }

    def search(gallery: str):
        return client.post(f"/v1/galleries/{state[gallery]}/search", json=query)

    first = search("attached")
    info = first.json()["rerank"]
    assert first.status_code == 200 and "degraded" not in info, first.text
    written = set(new_column(dsn, column))
    assert len(written) == info["embedded"] == info["scored_new"] == reembedded_rows(client) > 20
    assert not written & {5, 6}
    again = search("attached")
    assert again.json()["rerank"]["embedded"] == 0 and calls(embedder) == 1
    assert top_ids(again) == top_ids(first) == top_ids(search("copied"))

    job = client.post(
        f"/v1/galleries/{state['attached']}/reembed",
        json={"model_id": state["model_id"], "order": "gallery"},
    )
    assert job.status_code == 202, job.text
    done = client.get(f"/v1/upgrades/{job.json()['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    report = done["report"]["reembed"]
    assert (report["skipped"], report["reembedded"]) == (2, N - 2), report
    filled = new_column(dsn, column)
    assert set(filled) == set(range(N)) - {5, 6}
    progress = client.get(f"/v1/galleries/{state['attached']}").json()["reembedded"]
    assert progress[0]["reembedded"] == len(filled)
    # What the job wrote is what the embedder answered for the row's text (the recorded mpnet
    # gloss vector of that synset).
    np.testing.assert_allclose(filled[7], wordnet_small[f"gloss.{NEW}"][7], rtol=1e-5, atol=1e-6)
