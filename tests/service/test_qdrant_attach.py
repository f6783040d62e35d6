"""Attaching a Qdrant collection as a gallery (issue 27, item 1), on the embedded local mode.

The collection is built from real vectors (tests/fixtures/wordnet_small.npz: old = MiniLM
glosses, new = mpnet glosses) by a client that is closed before the service opens the folder
(local mode locks it to one client). The attached gallery must search like the same vectors
uploaded as an ordinary gallery, train upgrades from the collection, and never write to it.

Attached galleries keep no vector in the FAISS or Milvus engine, so the tests run on both SQL
backends with FAISS only (``faiss_only``); the copied gallery they compare with is a FAISS one.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException

from app.vectors.qdrant.source import QdrantSource, connection
from tests.service.celery_worker import wait_for_job
from tests.service.conftest import problem, snapshot

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")

OLD, NEW = "gloss.all-MiniLM-L6-v2", "gloss.all-mpnet-base-v2"
N = 300  # points in the collection


def qdrant_root(tmp_path: Path, tenant: str = "local") -> Path:
    """The tenant's folder (the local tenant's: ``local``) under the service's default Qdrant
    root in the tests' data dir (``make_settings``)."""
    return tmp_path / "data" / "qdrant" / tenant


def build_collection(
    folder: Path,
    name: str,
    vectors: np.ndarray,
    ids: list[int | str],
    *,
    vector: str | None = None,
    distance: models.Distance = models.Distance.COSINE,
) -> None:
    """A local-mode collection of ``vectors`` (closed again: the service opens it next)."""
    client = QdrantClient(path=str(folder))
    params = models.VectorParams(size=vectors.shape[1], distance=distance)
    client.create_collection(name, vectors_config={vector: params} if vector else params)
    client.upsert(
        name,
        points=[
            models.PointStruct(id=i, vector={vector: v.tolist()} if vector else v.tolist())
            for i, v in zip(ids, vectors, strict=True)
        ],
    )
    client.close()


def collection_points(folder: Path, name: str) -> list[tuple[str, list[float]]]:
    client = QdrantClient(path=str(folder))
    try:
        records, _ = client.scroll(name, limit=10_000, with_vectors=True)
        return sorted((str(r.id), r.vector) for r in records)
    finally:
        client.close()


@pytest.fixture
def nouns(tmp_path: Path, wordnet_small: dict) -> dict:
    """A collection ``nouns`` of N old vectors with integer ids 0…N−1 (item ids "0"…)."""
    old = wordnet_small[OLD][:N]
    build_collection(qdrant_root(tmp_path) / "nouns", "nouns", old, list(range(N)))
    return {
        "old": old,
        "new": wordnet_small[NEW][:N],
        "ids": [str(i) for i in range(N)],
        "source": {"engine": "qdrant", "path": "nouns", "collection": "nouns"},
    }


def attach(client: TestClient, source: dict, name: str = "attached", **extra) -> dict:
    body = {"name": name, "model_name": "all-MiniLM-L6-v2", "source": source, **extra}
    response = client.post("/v1/galleries", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def copied_gallery(client: TestClient, ids: list[str], vectors: np.ndarray) -> dict:
    gallery = client.post(
        "/v1/galleries",
        json={
            "name": "copied",
            "dim": vectors.shape[1],
            "model_name": "all-MiniLM-L6-v2",
            "metric": "cosine",
        },
    ).json()
    upload = client.post(
        f"/v1/galleries/{gallery['id']}/vectors", json={"ids": ids, "vectors": vectors.tolist()}
    )
    assert upload.status_code == 200, upload.text
    return gallery


def top_ids(response: httpx.Response) -> list[list[str]]:
    assert response.status_code == 200, response.text
    return [[hit["id"] for hit in row] for row in response.json()["results"]]


def test_attach_takes_dimension_metric_and_count_from_the_collection(
    client: TestClient, nouns: dict
) -> None:
    gallery = attach(client, nouns["source"])
    assert (gallery["dim"], gallery["metric"], gallery["count"]) == (384, "cosine", N)
    # The path is read under the tenant's own folder of the root, and the source says which.
    assert gallery["source"] == {**nouns["source"], "vector": None, "folder": "local"}
    assert client.get(f"/v1/galleries/{gallery['id']}").json()["count"] == N
    found = client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["7", "3"]})
    assert found.status_code == 200, found.text
    # Qdrant keeps Cosine vectors normalised: the direction is what the gallery reads.
    expected = nouns["old"][[7, 3]] / np.linalg.norm(nouns["old"][[7, 3]], axis=1, keepdims=True)
    np.testing.assert_allclose(found.json()["vectors"], expected, rtol=1e-4, atol=1e-5)
    missing = problem(
        client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["7", "x", "400"]}),
        404,
    )
    assert [e["field"] for e in missing["errors"]] == ["ids[1]", "ids[2]"]


def test_writes_to_an_attached_gallery_are_refused_and_change_nothing(
    client: TestClient, nouns: dict, tmp_path: Path
) -> None:
    gallery = attach(client, nouns["source"])
    url = f"/v1/galleries/{gallery['id']}/vectors"
    before = snapshot(client)
    upload = problem(client.post(url, json={"ids": ["0"], "vectors": [[0.1] * 384]}), 409)
    assert "never writes" in upload["detail"]
    problem(client.post(url, json={"ids": ["new"], "vectors": [[0.1] * 384]}), 409)
    problem(client.request("DELETE", url, json={"ids": ["0"]}), 409)
    assert snapshot(client) == before
    # The collection itself: the service lets go of the folder, then it is read back unchanged.
    from app.vectors.qdrant.source import close_connections

    close_connections()
    points = collection_points(qdrant_root(tmp_path) / "nouns", "nouns")
    assert len(points) == N and points[0][0] == "0"
    # Deleting the gallery detaches it: the collection stays.
    assert client.delete(f"/v1/galleries/{gallery['id']}").status_code == 204
    close_connections()
    assert len(collection_points(qdrant_root(tmp_path) / "nouns", "nouns")) == N


@pytest.mark.parametrize(
    ("source", "field", "words"),
    [
        ({"collection": "absent"}, "source.collection", "no collection"),
        ({"vector": "image"}, "source.vector", "unnamed vector"),
        ({"path": "/etc"}, "source.path", "must lie under"),
        ({"path": "../../outside"}, "source.path", "must lie under"),
        ({"path": "empty"}, "source.path", "not an embedded Qdrant folder"),
        (
            {"path": None, "url": "http://127.0.0.1:1", "collection": "nouns"},
            "source.url",
            "unreachable",
        ),
        (
            {"path": None, "url": "http://127.0.0.1:1", "api_key_env": "NOBACKFILL_DATABASE_URL"},
            "source.api_key_env",
            "must be NOBACKFILL_QDRANT_KEY",
        ),
    ],
)
def test_attach_refusals_name_the_field_and_write_nothing(
    make_client, nouns: dict, tmp_path: Path, source: dict, field: str, words: str
) -> None:
    # The URL cases name a server the settings allow (others: tests/service/test_qdrant_migrate).
    client = make_client(qdrant_allowed_urls=["http://127.0.0.1:1"])
    (qdrant_root(tmp_path) / "empty").mkdir()
    body = {k: v for k, v in {**nouns["source"], **source}.items() if v is not None}
    before = snapshot(client)
    refused = problem(client.post("/v1/galleries", json={"name": "g", "source": body}), 422)
    assert refused["errors"][0]["field"] == field, refused
    assert words in refused["detail"], refused
    assert snapshot(client) == before
    assert not (tmp_path / "outside").exists()


def test_named_vectors_and_metrics_are_checked(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    old = wordnet_small[OLD][:20]
    folder = qdrant_root(tmp_path) / "named"
    build_collection(folder, "named", old, list(range(20)), vector="text")
    build_collection(
        qdrant_root(tmp_path) / "euclid",
        "euclid",
        old,
        list(range(20)),
        distance=models.Distance.EUCLID,
    )
    source = {"engine": "qdrant", "path": "named", "collection": "named"}
    unnamed = problem(client.post("/v1/galleries", json={"name": "g", "source": source}), 422)
    assert "['text']" in unnamed["detail"]
    wrong = problem(
        client.post("/v1/galleries", json={"name": "g", "source": {**source, "vector": "img"}}),
        422,
    )
    assert "no vector 'img'" in wrong["detail"]
    euclid = {"engine": "qdrant", "path": "euclid", "collection": "euclid"}
    metric = problem(client.post("/v1/galleries", json={"name": "g", "source": euclid}), 422)
    assert metric["errors"][0]["field"] == "source.vector" and "need Cosine" in metric["detail"]
    gallery = attach(client, {**source, "vector": "text"})
    assert gallery["count"] == 20
    found = top_ids(
        client.post(
            f"/v1/galleries/{gallery['id']}/search", json={"vectors": old[:2].tolist(), "k": 3}
        )
    )
    assert [row[0] for row in found] == ["0", "1"]


def test_uuid_and_large_point_ids_are_item_ids(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    old = wordnet_small[OLD][:30]
    ids: list[int | str] = [str(uuid.UUID(int=7919 * (i + 1))) for i in range(28)]
    ids += [2**63 + 5, 2**62 + 1]  # integers that cannot be internal ids as they are
    build_collection(qdrant_root(tmp_path) / "mixed", "mixed", old, ids)
    gallery = attach(client, {"engine": "qdrant", "path": "mixed", "collection": "mixed"})
    assert gallery["count"] == 30
    found = top_ids(
        client.post(
            f"/v1/galleries/{gallery['id']}/search",
            json={"vectors": old[[0, 28, 29]].tolist(), "k": 2},
        )
    )
    assert [row[0] for row in found] == [ids[0], str(2**63 + 5), str(2**62 + 1)]
    read = client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": [ids[3]]})
    assert read.status_code == 200 and read.json()["ids"] == [ids[3]]
    # A non-canonical spelling names no point.
    problem(
        client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": [ids[3].upper()]}), 404
    )


def test_attached_search_equals_the_copied_gallery_old_and_bridged(
    client: TestClient, nouns: dict
) -> None:
    searches_like_the_copied_gallery(client, nouns["source"], nouns)


def searches_like_the_copied_gallery(client: TestClient, source: dict, nouns: dict) -> None:
    """attach → dataset paired by point ids → upgrade trained on the collection's vectors →
    search in the collection: the same top-10 as the same vectors uploaded as a gallery (any
    engine's collection of ``nouns``: N old vectors, item ids "0"…)."""
    attached = attach(client, source)
    copied = copied_gallery(client, nouns["ids"], nouns["old"])
    train = np.arange(0, 200)
    queries = np.arange(200, N)

    def searched(body: dict) -> dict[str, list[list[str]]]:
        return {
            g["id"]: top_ids(client.post(f"/v1/galleries/{g['id']}/search", json=body))
            for g in (attached, copied)
        }

    old_to_old = searched({"vectors": nouns["old"][queries].tolist(), "k": 10})
    assert old_to_old[attached["id"]] == old_to_old[copied["id"]]

    dataset = client.post(
        "/v1/datasets", json={"name": "mpnet", "gallery_id": attached["id"]}
    ).json()
    items_url = f"/v1/datasets/{dataset['id']}/items"
    # Items pair by the collection's point ids: an id that names no point is refused.
    stray = client.post(
        items_url, json={"ids": ["0", "400"], "features": nouns["new"][:2].tolist()}
    )
    assert problem(stray, 422)["errors"][0]["field"] == "ids[1]"
    ids = [nouns["ids"][i] for i in train]
    items = client.post(items_url, json={"ids": ids, "features": nouns["new"][train].tolist()})
    assert items.status_code == 200, items.text
    created = client.post(
        "/v1/upgrades", json={"dataset_id": dataset["id"], "method": "procrustes", "seed": 3}
    )
    assert created.status_code == 202, created.text
    job = wait_for_job(client, created.json()["id"], timeout=300)
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["paired_items"] == len(train)

    body = {"features": nouns["new"][queries].tolist(), "model_id": job["model_id"], "k": 10}
    bridged = searched(body)
    assert bridged[attached["id"]] == bridged[copied["id"]]
    # Bridged search finds the query's own item far above chance.
    own = np.mean(
        [nouns["ids"][q] in row for q, row in zip(queries, bridged[attached["id"]], strict=True)]
    )
    assert own > 0.3, own


def test_qdrant_unreachable_mid_search_is_a_503_and_writes_nothing(
    client: TestClient, nouns: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    gallery = attach(client, nouns["source"])
    url = f"/v1/galleries/{gallery['id']}/search"
    assert top_ids(client.post(url, json={"vectors": nouns["old"][:1].tolist(), "k": 3}))
    before = snapshot(client)

    def lost(*args, **kwargs):
        raise ResponseHandlingException(httpx.ConnectError("connection refused"))

    monkeypatch.setattr(QdrantClient, "query_batch_points", lost)
    body = problem(client.post(url, json={"vectors": nouns["old"][:2].tolist(), "k": 3}), 503)
    assert "unreachable" in body["detail"]
    assert client.post(url, json={"vectors": nouns["old"][:2].tolist(), "k": 3}).headers[
        "Retry-After"
    ]
    assert snapshot(client) == before
    monkeypatch.undo()
    assert top_ids(client.post(url, json={"vectors": nouns["old"][:1].tolist(), "k": 3}))


def test_tied_points_rank_by_id_like_the_copied_gallery(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    """Duplicate documents embed to the same vector: Qdrant returns tied points in its own order
    (here: the order they were stored in) and may cut a tie at the k-th place anywhere. The
    service asks past the k-th place when the scores tie there and orders ties by internal id
    (a point id, for integer points), as a copied gallery orders them by its internal ids
    (the order its items were first stored: here the point ids' order)."""
    old = wordnet_small[OLD][:60].copy()
    tied = [41, 7, 33, 2, 19]  # stored in this order: not the id order
    old[tied] = old[0]
    point_ids = list(range(60))
    order = tied + [i for i in point_ids if i not in tied]
    build_collection(qdrant_root(tmp_path) / "dups", "dups", old[order], order)
    attached = attach(client, {"engine": "qdrant", "path": "dups", "collection": "dups"})
    copied = copied_gallery(client, [str(i) for i in point_ids], old)
    for k in (2, 3, 5, 8):
        answers = [
            top_ids(
                client.post(
                    f"/v1/galleries/{g['id']}/search",
                    json={"vectors": old[[0, 1]].tolist(), "k": k},
                )
            )
            for g in (attached, copied)
        ]
        assert answers[0] == answers[1], k
        expected = [str(i) for i in sorted([0, *tied])]
        assert answers[0][0][: len(expected)] == expected[:k], k


def paired_dataset(client: TestClient, gallery_id: str, nouns: dict, items: range) -> str:
    """A dataset pairing the first items with their new vectors; its id."""
    dataset = client.post("/v1/datasets", json={"name": "mpnet", "gallery_id": gallery_id}).json()
    ids = [nouns["ids"][i] for i in items]
    stored = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        json={"ids": ids, "features": nouns["new"][list(items)].tolist()},
    )
    assert stored.status_code == 200, stored.text
    return dataset["id"]


def upgrade_on(client: TestClient, dataset_id: str) -> dict:
    """A procrustes upgrade on the dataset; the finished job."""
    created = client.post(
        "/v1/upgrades", json={"dataset_id": dataset_id, "method": "procrustes", "seed": 3}
    )
    assert created.status_code == 202, created.text
    return wait_for_job(client, created.json()["id"], timeout=300)


def test_each_upgrade_rechecks_the_collection_and_reports_a_changed_count(
    client: TestClient, nouns: dict
) -> None:
    """Points added or deleted by the collection's owner after attach: the next job counts them
    again, says so in its report and corrects the gallery's count; unchanged, it says that."""
    attached = attach(client, nouns["source"])
    dataset_id = paired_dataset(client, attached["id"], nouns, range(10, 160))
    job = upgrade_on(client, dataset_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["collection"] == {"points_recorded": N, "points_now": N, "changed": False}
    settings = client.app.state.service.settings
    with connection(
        settings, QdrantSource.of({**nouns["source"], "folder": "local"})
    ).use() as qdrant:
        qdrant.delete("nouns", points_selector=models.PointIdsList(points=[0, 1, 2, 250, 251]))
    job = upgrade_on(client, dataset_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["collection"] == {
        "points_recorded": N,
        "points_now": N - 5,
        "changed": True,
    }
    assert client.get(f"/v1/galleries/{attached['id']}").json()["count"] == N - 5


def test_an_upgrade_on_a_collection_whose_dimension_changed_fails_saying_so(
    client: TestClient, nouns: dict
) -> None:
    attached = attach(client, nouns["source"])
    dataset_id = paired_dataset(client, attached["id"], nouns, range(150))
    settings = client.app.state.service.settings
    with connection(
        settings, QdrantSource.of({**nouns["source"], "folder": "local"})
    ).use() as qdrant:
        qdrant.delete_collection("nouns")
        qdrant.create_collection(
            "nouns", vectors_config=models.VectorParams(size=8, distance=models.Distance.COSINE)
        )
        # Every point still there (the submission finds its pairs), now 8-dimensional.
        points = [
            models.PointStruct(id=i, vector=v[:8].tolist()) for i, v in enumerate(nouns["old"])
        ]
        qdrant.upsert("nouns", points=points)
    job = upgrade_on(client, dataset_id)
    assert job["status"] == "failed"
    assert "changed under the service" in job["error"] and "384" in job["error"], job["error"]
    before = client.get(f"/v1/galleries/{attached['id']}").json()
    assert before["count"] == N and before["dim"] == 384
