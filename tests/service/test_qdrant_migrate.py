"""Migrating an attached Qdrant collection in place (issue 27, item 2), on the embedded local mode.

attach → upgrade (procrustes, query objective) → plan → re-embedded items uploaded: they become a
second, named vector (``nobackfill_<model id>``) of the same points, with the model id in the
payload, and the old vectors stay as they were. Transition and mixed searches run one Qdrant
search per vector and merge them with the service's merge: the same top-10 as the same flow on
the same vectors uploaded as an ordinary gallery (whose re-embedded features live in SQL).

Real vectors (tests/fixtures/wordnet_small.npz: old = MiniLM glosses, new = mpnet glosses): point
i of the collection is synset i's gloss, its item id ``str(i)``. Both SQL backends; FAISS only,
as tests/service/test_qdrant_attach.py (the copied gallery is a FAISS one).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException
from sqlalchemy import func, select

from app.ml.backfill.relevance import fit_relevance
from app.vectors.qdrant.source import QdrantSource, connection
from app.vectors.tables import ReembeddedVector
from tests.service.celery_worker import wait_for_job
from tests.service.conftest import problem, snapshot
from tests.service.test_backfill_api import upload_reembedded
from tests.service.test_qdrant_attach import attach, build_collection, copied_gallery, qdrant_root
from tests.service.test_queries_api import NEW, OLD, pair_glosses

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")

N = 400  # points in the collection
SOURCE = {"engine": "qdrant", "path": "glosses", "collection": "glosses"}


@pytest.fixture
def migration(
    client: TestClient, tmp_path: Path, wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> dict:
    """The collection attached, the same vectors copied into a gallery, and a backbone model
    upgraded on the attached gallery (usable on both: same model name and dimension).

    The relevance maps are forced on for every list (fitted on as few as 2 relevant items, as
    test_backfill_api's transition test does): this fixture's held-out queries give the native
    list a map and the old list none, and the merge then never ranks a native hit first (an
    open point of the merge itself, on any gallery), so no answer would show the new vector."""
    old = wordnet_small[f"gloss.{OLD}"][:N]
    build_collection(qdrant_root(tmp_path) / "glosses", "glosses", old, list(range(N)))
    found = attached_and_upgraded(client, SOURCE, old, wordnet_small, monkeypatch)
    return found | {"vector": f"nobackfill_{found['model_id']}"}


def attached_and_upgraded(
    client: TestClient,
    source: dict,
    old: np.ndarray,
    wordnet_small: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> dict:
    """``source`` (a collection of ``old``, item ids "0"…) attached, the same vectors copied into
    a gallery, and a backbone model upgraded on the attached gallery (see ``migration``)."""
    monkeypatch.setattr(
        "app.ml.backfill.plan.fit_relevance", functools.partial(fit_relevance, min_positives=2)
    )
    ids = [str(i) for i in range(len(old))]
    attached = attach(client, source)
    copied = copied_gallery(client, ids, old)
    setup = pair_glosses(client, wordnet_small, attached["id"], ids)
    body = {"dataset_id": setup["dataset_id"], "method": "procrustes", "objective": "query"}
    created = client.post("/v1/upgrades", json=body)
    assert created.status_code == 202, created.text
    job = wait_for_job(client, created.json()["id"], timeout=300)
    assert job["status"] == "succeeded", job["error"]
    return {
        "attached": attached["id"],
        "copied": copied["id"],
        "model_id": job["model_id"],
        "ids": ids,
    }


@contextmanager
def collection(client: TestClient) -> Iterator[QdrantClient]:
    """The service's own client of the folder (local mode locks it to one client)."""
    settings = client.app.state.service.settings
    with connection(settings, QdrantSource.of({**SOURCE, "folder": "local"})).use() as qdrant:
        yield qdrant


def reembed(client: TestClient, gallery_id: str, model_id: str, wordnet_small: dict, ids):
    """Upload the new model's gloss features of ``ids`` (item "i" is synset i; another id gets
    synset 0's)."""
    features = wordnet_small[f"gloss.{NEW}"][[int(i) if i.isdigit() else 0 for i in ids]]
    return upload_reembedded(client, gallery_id, model_id, ids, features)


def old_vectors(records: list[models.Record]) -> dict[str, list[float]]:
    """Each point's own (unnamed) vector, however the client returns it."""
    return {str(r.id): (r.vector[""] if isinstance(r.vector, dict) else r.vector) for r in records}


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def hits(response: httpx.Response) -> list[list[tuple[str, str]]]:
    assert response.status_code == 200, response.text
    return [[(h["id"], h["space"]) for h in row] for row in response.json()["results"]]


def transition(
    client: TestClient, gallery_id: str, model_id: str, wordnet_small: dict, rows=np.r_[320:352]
):
    """Both models' lemma vectors of synsets ``rows`` (by default items outside the upgrade's
    pairs and query log)."""
    body = {
        "model_id": model_id,
        "features": wordnet_small[f"lemma.{NEW}"][rows].tolist(),
        "old_vectors": wordnet_small[f"lemma.{OLD}"][rows].tolist(),
        "k": 10,
    }
    return client.post(f"/v1/galleries/{gallery_id}/search", json=body)


def test_in_place_migration_writes_a_second_vector_and_searches_like_the_copied_gallery(
    client: TestClient, migration: dict, wordnet_small: dict
) -> None:
    attached, copied, model_id = migration["attached"], migration["copied"], migration["model_id"]
    name = migration["vector"]
    with collection(client) as qdrant:
        before, _ = qdrant.scroll("glosses", limit=N, with_vectors=True)
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

    # The collection: a second, named vector on exactly the re-embedded points, the model id in
    # their payload, every old vector as it was.
    with collection(client) as qdrant:
        vectors = qdrant.get_collection("glosses").config.params.vectors
        after, _ = qdrant.scroll("glosses", limit=N, with_vectors=True, with_payload=True)
    assert set(vectors) == {"", name}
    assert (vectors[name].size, vectors[name].distance) == (768, models.Distance.COSINE)
    assert old_vectors(after) == old_vectors(before)
    written = {str(r.id): r for r in after if isinstance(r.vector, dict) and name in r.vector}
    assert set(written) == set(plan["ids"])
    for item, record in written.items():
        assert set(record.payload["nobackfill_models"]) == {model_id}
        expected = unit(wordnet_small[f"gloss.{NEW}"][int(item)])
        np.testing.assert_allclose(record.vector[name], expected, rtol=1e-4, atol=1e-5)
    assert all(
        "nobackfill_models" not in (r.payload or {}) for r in after if str(r.id) not in written
    )
    # The service's own store keeps one row per item and no vector.
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
    assert again["reembedded"] == 100

    searches_match(client, migration, wordnet_small, plan["ids"])
    # Old-space search is the old vector's alone, unchanged by the migration.
    old_q = {"vectors": wordnet_small[f"lemma.{OLD}"][:8].tolist(), "k": 10}
    old_hits = [client.post(f"/v1/galleries/{g}/search", json=old_q) for g in (attached, copied)]
    assert [[h["id"] for h in row] for row in old_hits[0].json()["results"]] == [
        [h["id"] for h in row] for row in old_hits[1].json()["results"]
    ]


def searches_match(
    client: TestClient, migration: dict, wordnet_small: dict, planned: list[str]
) -> None:
    """Transition search (both query vectors) and the new model's mixed search of the attached
    gallery: the copied gallery's answers, hit for hit, and from both spaces. Half the queries
    are about re-embedded items (``planned``), half about others."""
    attached, copied, model_id = migration["attached"], migration["copied"], migration["model_id"]
    rows = np.r_[[int(i) for i in planned[:16]], 320:336]
    answers = {
        g: hits(transition(client, g, model_id, wordnet_small, rows)) for g in (attached, copied)
    }
    assert answers[attached] == answers[copied]
    assert {space for row in answers[attached] for _, space in row} == {"new", "old"}
    assert all(len(row) == 10 for row in answers[attached])
    features = {"model_id": model_id, "features": wordnet_small[f"lemma.{NEW}"][rows].tolist()}
    mixed = {
        g: hits(client.post(f"/v1/galleries/{g}/search", json=features | {"k": 10}))
        for g in (attached, copied)
    }
    assert mixed[attached] == mixed[copied]


def test_a_point_deleted_after_the_plan_is_skipped_and_reported(
    client: TestClient, migration: dict, wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached, model_id = migration["attached"], migration["model_id"]
    plan = client.post(
        f"/v1/galleries/{attached}/backfill-plan", json={"model_id": model_id, "count": 10}
    ).json()
    gone = plan["ids"][3]
    with collection(client) as qdrant:
        qdrant.delete("glosses", points_selector=models.PointIdsList(points=[int(gone)]))
    stored = reembed(client, attached, model_id, wordnet_small, plan["ids"])
    assert stored.status_code == 200, stored.text
    assert stored.json() == {"upserted": 9, "count": N, "reembedded": 9, "skipped": [gone]}
    with collection(client) as qdrant:
        written = qdrant.count(
            "glosses",
            count_filter=models.Filter(
                must=[models.HasVectorCondition(has_vector=migration["vector"])]
            ),
        ).count
    assert written == 9
    progress = client.get(f"/v1/galleries/{attached}").json()["reembedded"]
    assert progress[0]["reembedded"] == 9

    # Deleted between the service's look-up and its write: Qdrant refuses the write, the
    # service looks the points up again and writes the others.
    more = client.post(
        f"/v1/galleries/{attached}/backfill-plan", json={"model_id": model_id, "count": 5}
    ).json()["ids"]
    update = QdrantClient.update_vectors

    def deleted_first(self, collection_name, points, **kwargs):
        monkeypatch.setattr(QdrantClient, "update_vectors", update)
        self.delete(collection_name, points_selector=models.PointIdsList(points=[int(more[0])]))
        return update(self, collection_name, points, **kwargs)

    monkeypatch.setattr(QdrantClient, "update_vectors", deleted_first)
    raced = reembed(client, attached, model_id, wordnet_small, more)
    assert raced.json() == {"upserted": 4, "count": N, "reembedded": 13, "skipped": [more[0]]}

    # An id that can name no point at all is the caller's mistake, as on any gallery.
    before = snapshot(client)
    refused = problem(reembed(client, attached, model_id, wordnet_small, ["7", "x"]), 422)
    assert refused["errors"][0]["field"] == "ids[1]"
    assert snapshot(client) == before


def test_qdrant_unreachable_mid_migration_is_a_503_and_writes_nothing(
    client: TestClient, migration: dict, wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached, model_id = migration["attached"], migration["model_id"]
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][::4]).status_code
    assert hits(transition(client, attached, model_id, wordnet_small))
    before = snapshot(client)

    def lost(*args, **kwargs):
        raise ResponseHandlingException(httpx.ConnectError("connection refused"))

    # Mid-search: the re-embedded vector's search answers, the old vector's does not.
    searched = QdrantClient.query_batch_points
    calls: list[int] = []

    def second_call_lost(self, *args, **kwargs):
        calls.append(1)
        return lost() if len(calls) % 2 == 0 else searched(self, *args, **kwargs)

    monkeypatch.setattr(QdrantClient, "query_batch_points", second_call_lost)
    response = transition(client, attached, model_id, wordnet_small)
    body = problem(response, 503)
    assert "unreachable" in body["detail"] and response.headers["Retry-After"]
    assert len(calls) == 2
    monkeypatch.setattr(QdrantClient, "update_vectors", lost)
    upload = reembed(client, attached, model_id, wordnet_small, migration["ids"][1::4])
    assert problem(upload, 503)["detail"]
    assert snapshot(client) == before
    monkeypatch.undo()
    assert hits(transition(client, attached, model_id, wordnet_small))


def test_searching_the_spaces_unmerged_is_refused(
    client: TestClient, migration: dict, wordnet_small: dict
) -> None:
    attached, model_id, name = migration["attached"], migration["model_id"], migration["vector"]
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][::2]).status_code
    before = snapshot(client)
    # The re-embedded vector as a gallery of its own: half the points, new space, no merge.
    alone = problem(
        client.post(
            "/v1/galleries", json={"name": "new-only", "source": SOURCE | {"vector": name}}
        ),
        422,
    )
    assert alone["errors"][0]["field"] == "source.vector" and "re-embedded" in alone["detail"]
    # The collection's owner dropped the vector: the old vector alone would answer for items
    # that should be scored in the new space, unmerged. Refused, nothing written.
    with collection(client) as qdrant:
        qdrant.delete_vector_name("glosses", name)
    gone = problem(transition(client, attached, model_id, wordnet_small), 409)
    assert name in gone["detail"]
    features = {"model_id": model_id, "features": wordnet_small[f"lemma.{NEW}"][:2].tolist()}
    problem(client.post(f"/v1/galleries/{attached}/search", json=features), 409)
    assert snapshot(client) == before


@pytest.mark.parametrize("deleted", ["model", "gallery"])
def test_a_cascaded_delete_removes_the_service_vector_and_provenance_from_the_collection(
    client: TestClient, migration: dict, wordnet_small: dict, deleted: str
) -> None:
    """The named vector and the payload entries are the service's writes: deleting the model
    (or detaching the gallery) with ``?cascade=true`` takes them out of the owner's collection,
    leaving every point, its own vector and any other payload as they were."""
    attached, model_id, name = migration["attached"], migration["model_id"], migration["vector"]
    with collection(client) as qdrant:
        qdrant.set_payload("glosses", payload={"owner": "kept"}, points=[0, 1, 2])
        before, _ = qdrant.scroll("glosses", limit=N, with_vectors=True, with_payload=True)
    assert reembed(client, attached, model_id, wordnet_small, migration["ids"][:40]).status_code
    if deleted == "model":
        client.delete(f"/v1/galleries/{migration['copied']}")
        gone = client.delete(f"/v1/models/{model_id}", params={"cascade": "true"})
    else:
        for dataset in client.get("/v1/datasets").json()["items"]:
            if dataset["gallery_id"] == attached:
                assert client.delete(f"/v1/datasets/{dataset['id']}").status_code == 204
        gone = client.delete(f"/v1/galleries/{attached}", params={"cascade": "true"})
    assert gone.status_code == 200, gone.text
    with collection(client) as qdrant:
        vectors = qdrant.get_collection("glosses").config.params.vectors
        after, _ = qdrant.scroll("glosses", limit=N, with_vectors=True, with_payload=True)
    assert name not in (vectors if isinstance(vectors, dict) else {})
    assert old_vectors(after) == old_vectors(before)
    assert {str(r.id): r.payload for r in after} == {str(r.id): r.payload for r in before}
