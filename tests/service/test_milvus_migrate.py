"""Migrating an attached Milvus collection in place (issue 27, item 2, Milvus), on milvus-lite,
and for a representative subset (``ON_BOTH``: the migration and its searches, a row deleted under
it, the cascaded drop) on a real Milvus server too (Milvus 2.3.5 standalone; the fixtures of
``tests/service/test_milvus_attach.py`` put the owner's collection there).

attach → upgrade (procrustes, query objective) → plan → re-embedded items uploaded: they go into
the sibling collection ``<collection>__nobackfill_<model id>`` of the same file, keyed by the same
primary keys, with the model id beside each vector; the owner's collection is not touched.
Transition and mixed searches run one Milvus search per collection and merge them with the
service's merge: the same top-10 as the same flow on the same vectors uploaded as an ordinary
gallery (whose re-embedded features live in SQL).

Real vectors (tests/fixtures/wordnet_small.npz): row i of the collection is synset i's gloss,
its key i. Both SQL backends; FAISS only, as tests/service/test_milvus_attach.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusUnavailableException
from sqlalchemy import func, select

from app.vectors.tables import ReembeddedVector
from tests.service.conftest import problem, snapshot
from tests.service.milvus_server import milvus_server_uri  # noqa: F401  (the fixture)
from tests.service.test_milvus_attach import (  # noqa: F401  (attach_source … place: fixtures)
    ON_BOTH,
    SOURCE,
    attach_source,
    build_collection,
    built_at,
    make_settings,
    owner,
    place,
    rows_of,
)
from tests.service.test_qdrant_migrate import (
    attached_and_upgraded,
    hits,
    reembed,
    searches_match,
    transition,
)
from tests.service.test_queries_api import NEW, OLD

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")

N = 400  # rows in the collection


@pytest.fixture
def migration(
    client: TestClient,
    tmp_path: Path,
    wordnet_small: dict,
    monkeypatch: pytest.MonkeyPatch,
    attach_source: dict,  # noqa: F811  (the imported fixture)
) -> dict:
    """The collection attached, the same vectors copied into a gallery, and a backbone model
    upgraded on the attached gallery (relevance maps forced on, as test_qdrant_migrate's)."""
    old = wordnet_small[f"gloss.{OLD}"][:N]
    where = built_at(tmp_path, attach_source, "nouns.db")
    build_collection(where, "nouns", old, list(range(N)))
    found = attached_and_upgraded(client, attach_source, old, wordnet_small, monkeypatch)
    return found | {
        "sibling": f"nouns__nobackfill_{found['model_id']}",
        "source": attach_source,
    }


def sibling_rows(client: TestClient, name: str, source: dict = SOURCE) -> dict[int, dict]:
    with owner(client, source) as milvus:
        # Strong, as the service's own reads (the test's read may follow a write at once).
        rows = milvus.query(
            name, filter="", output_fields=["*"], limit=9999, consistency_level="Strong"
        )
    return {int(r["id"]): r for r in rows}


@ON_BOTH
def test_in_place_migration_fills_a_sibling_collection_and_searches_like_the_copied_gallery(
    client: TestClient, migration: dict, wordnet_small: dict
) -> None:
    attached, copied, model_id = migration["attached"], migration["copied"], migration["model_id"]
    source = migration["source"]
    with owner(client, source) as milvus:
        before = rows_of(milvus, "nouns")
        schema_before = milvus.describe_collection("nouns")["fields"]
    planned = client.post(
        f"/v1/galleries/{attached}/backfill-plan", json={"model_id": model_id, "fraction": 0.25}
    )
    assert planned.status_code == 200, planned.text
    plan = planned.json()
    assert len(plan["ids"]) == 100 == len(set(plan["ids"]))
    assert set(plan["ids"]) <= set(migration["ids"]) and plan["total"] == N

    stored = reembed(client, attached, model_id, wordnet_small, plan["ids"])
    assert stored.json() == {"upserted": 100, "count": N, "reembedded": 100}, stored.text
    assert reembed(client, copied, model_id, wordnet_small, plan["ids"]).status_code == 200

    # The sibling: exactly the re-embedded keys, their features and the model id beside them;
    # the owner's collection row for row and field for field as it was.
    written = sibling_rows(client, migration["sibling"], source)
    assert set(written) == {int(i) for i in plan["ids"]}
    for key, row in written.items():
        assert row["model_id"] == model_id and row["written_at"]
        expected = wordnet_small[f"gloss.{NEW}"][key]
        np.testing.assert_allclose(row["vector"], expected, rtol=1e-5, atol=1e-6)
    with owner(client, source) as milvus:
        assert rows_of(milvus, "nouns") == before
        assert milvus.describe_collection("nouns")["fields"] == schema_before
        assert sorted(milvus.list_collections()) == sorted(["nouns", migration["sibling"]])
    with client.app.state.service.db.sessions() as session:
        kept = session.execute(
            select(func.count(), func.count(ReembeddedVector.features)).where(
                ReembeddedVector.gallery_id == attached
            )
        ).one()
    assert tuple(kept) == (100, 0)

    progress = client.get(f"/v1/galleries/{attached}").json()["reembedded"]
    assert [
        {k: p[k] for k in ("model_id", "reembedded", "total", "fraction")} for p in progress
    ] == [{"model_id": model_id, "reembedded": 100, "total": N, "fraction": 0.25}]
    again = client.post(
        f"/v1/galleries/{attached}/backfill-plan", json={"model_id": model_id, "count": 10}
    ).json()
    assert len(again["ids"]) == 10 and not set(again["ids"]) & set(plan["ids"])

    # Transition and mixed searches: the copied gallery's answers, hit for hit.
    searches_match(client, migration, wordnet_small, plan["ids"])


@ON_BOTH
def test_a_row_deleted_after_the_plan_is_skipped_and_reported(
    client: TestClient, migration: dict, wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached, model_id, sibling = migration["attached"], migration["model_id"], migration["sibling"]
    source = migration["source"]
    plan = client.post(
        f"/v1/galleries/{attached}/backfill-plan", json={"model_id": model_id, "count": 10}
    ).json()
    gone = plan["ids"][3]
    with owner(client, source) as milvus:
        milvus.delete("nouns", filter=f"doc_id in [{gone}]")
    stored = reembed(client, attached, model_id, wordnet_small, plan["ids"])
    assert stored.status_code == 200, stored.text
    assert stored.json() == {"upserted": 9, "count": N, "reembedded": 9, "skipped": [gone]}
    assert set(sibling_rows(client, sibling, source)) == {int(i) for i in plan["ids"]} - {int(gone)}
    assert client.get(f"/v1/galleries/{attached}").json()["reembedded"][0]["reembedded"] == 9

    # Deleted between the service's look-up and its write: the write lands in the sibling, the
    # second look-up finds the owner's row gone, and the sibling row goes again.
    more = client.post(
        f"/v1/galleries/{attached}/backfill-plan", json={"model_id": model_id, "count": 5}
    ).json()["ids"]
    upsert = MilvusClient.upsert

    def deleted_first(self, collection_name, data, **kwargs):
        monkeypatch.setattr(MilvusClient, "upsert", upsert)
        self.delete("nouns", filter=f"doc_id in [{more[0]}]")
        return upsert(self, collection_name, data, **kwargs)

    monkeypatch.setattr(MilvusClient, "upsert", deleted_first)
    raced = reembed(client, attached, model_id, wordnet_small, more)
    assert raced.json() == {"upserted": 4, "count": N, "reembedded": 13, "skipped": [more[0]]}
    assert int(more[0]) not in sibling_rows(client, sibling, source)

    # A deleted row's sibling row is never a hit: the owner deletes a re-embedded row.
    with owner(client, source) as milvus:
        milvus.delete("nouns", filter=f"doc_id in [{plan['ids'][0]}]")
    rows = np.r_[[int(i) for i in plan["ids"][:4]]]
    found = hits(transition(client, attached, model_id, wordnet_small, rows))
    assert all(plan["ids"][0] not in {item for item, _ in row} for row in found)

    # An id that can name no row at all is the caller's mistake, as on any gallery.
    before = snapshot(client)
    refused = problem(reembed(client, attached, model_id, wordnet_small, ["7", "x"]), 422)
    assert refused["errors"][0]["field"] == "ids[1]"
    assert snapshot(client) == before


def test_milvus_unreachable_mid_migration_is_a_503_and_writes_nothing(
    client: TestClient, migration: dict, wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached, model_id = migration["attached"], migration["model_id"]
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][::4]).status_code
    assert hits(transition(client, attached, model_id, wordnet_small))
    before = snapshot(client)
    sibling_before = sibling_rows(client, migration["sibling"])

    def lost(*args, **kwargs):
        raise MilvusUnavailableException(message="server unavailable")

    # Mid-search: the sibling's search answers, the owner's collection's does not.
    searched = MilvusClient.search
    calls: list[int] = []

    def second_call_lost(self, *args, **kwargs):
        calls.append(1)
        return lost() if len(calls) % 2 == 0 else searched(self, *args, **kwargs)

    monkeypatch.setattr(MilvusClient, "search", second_call_lost)
    response = transition(client, attached, model_id, wordnet_small)
    body = problem(response, 503)
    assert "unreachable" in body["detail"] and response.headers["Retry-After"]
    assert len(calls) == 2
    monkeypatch.setattr(MilvusClient, "upsert", lost)
    upload = reembed(client, attached, model_id, wordnet_small, migration["ids"][1::4])
    assert problem(upload, 503)["detail"]
    assert snapshot(client) == before
    monkeypatch.undo()
    assert sibling_rows(client, migration["sibling"]).keys() == sibling_before.keys()
    assert hits(transition(client, attached, model_id, wordnet_small))


def test_searching_the_spaces_unmerged_is_refused(
    client: TestClient, migration: dict, wordnet_small: dict
) -> None:
    attached, model_id, sibling = migration["attached"], migration["model_id"], migration["sibling"]
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][::2]).status_code
    before = snapshot(client)
    # The sibling as a gallery of its own: half the rows, new space, no merge.
    alone = SOURCE | {"collection": sibling, "id_field": "id", "vector_field": "vector"}
    refused = problem(client.post("/v1/galleries", json={"name": "new-only", "source": alone}), 422)
    assert refused["errors"][0]["field"] == "source.collection"
    assert "re-embedded" in refused["detail"]
    # Someone dropped the sibling: the old vectors alone would answer for items that should be
    # scored in the new space, unmerged. Refused, nothing written.
    with owner(client) as milvus:
        milvus.drop_collection(sibling)
    gone = problem(transition(client, attached, model_id, wordnet_small), 409)
    assert sibling in gone["detail"]
    features = {"model_id": model_id, "features": wordnet_small[f"lemma.{NEW}"][:2].tolist()}
    problem(client.post(f"/v1/galleries/{attached}/search", json=features), 409)
    assert snapshot(client) == before


@pytest.mark.parametrize(
    ("place", "deleted"),
    [("lite", "model"), ("lite", "gallery"), ("server", "gallery")],
    indirect=["place"],
)
def test_a_cascaded_delete_drops_the_sibling_collection(
    client: TestClient, migration: dict, wordnet_small: dict, deleted: str
) -> None:
    """Everything the service wrote for a model lies in its sibling collection: deleting the
    model (or detaching the gallery) with ``?cascade=true`` drops it; the owner's collection
    stays as it was."""
    attached, model_id, sibling = migration["attached"], migration["model_id"], migration["sibling"]
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][:40]).status_code
    source = migration["source"]
    with owner(client, source) as milvus:
        assert milvus.has_collection(sibling)
        before = rows_of(milvus, "nouns")
    if deleted == "model":
        client.delete(f"/v1/galleries/{migration['copied']}")
        gone = client.delete(f"/v1/models/{model_id}", params={"cascade": "true"})
    else:
        for dataset in client.get("/v1/datasets").json()["items"]:
            if dataset["gallery_id"] == attached:
                assert client.delete(f"/v1/datasets/{dataset['id']}").status_code == 204
        gone = client.delete(f"/v1/galleries/{attached}", params={"cascade": "true"})
    assert gone.status_code == 200, gone.text
    with owner(client, source) as milvus:
        assert not milvus.has_collection(sibling)
        assert rows_of(milvus, "nouns") == before
